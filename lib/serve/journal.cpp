// SPDX-License-Identifier: Apache-2.0
#include "serve/journal.hpp"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/error.hpp"

namespace ftp::serve {

namespace fs = std::filesystem;

std::string utc_now_iso8601() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[40];
  std::snprintf(b, sizeof b, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return b;
}

Journal::Journal(std::string dir, std::uint64_t max_bytes, int keep)
    : dir_(std::move(dir)), max_bytes_(max_bytes), keep_(std::max(1, keep)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw InputError("--state-dir " + dir_ + ": cannot create it: " + ec.message());
  std::ofstream f(path(), std::ios::app);
  if (!f) throw InputError("--state-dir " + dir_ + ": cannot write " + path());
}

std::string Journal::path() const { return (fs::path(dir_) / "shifts.jsonl").string(); }

std::vector<json::Json> Journal::read_locked() const {
  std::vector<json::Json> out;
  skipped_ = 0;
  for (int i = keep_; i >= 0; --i) {
    const std::string p = i == 0 ? path() : path() + "." + std::to_string(i);
    std::ifstream f(p);
    for (std::string line; std::getline(f, line);) {
      if (line.empty()) continue;
      try {
        json::Json j = json::parse_line(line);
        if (j.is_object() && j.contains("shift_id")) out.push_back(std::move(j));
        else ++skipped_;
      } catch (const std::exception&) {
        ++skipped_;  // a line torn by a crash mid-write
      }
    }
  }
  return out;
}

void Journal::append_locked(const json::Json& j) {
  const std::string line = j.dump() + "\n";
  std::error_code ec;
  const auto size = fs::file_size(path(), ec);
  if (!ec && size > 0 && size + line.size() > max_bytes_) {
    fs::remove(path() + "." + std::to_string(keep_), ec);
    for (int i = keep_ - 1; i >= 1; --i)
      fs::rename(path() + "." + std::to_string(i), path() + "." + std::to_string(i + 1), ec);
    fs::rename(path(), path() + ".1", ec);
  }
  std::ofstream f(path(), std::ios::app | std::ios::binary);
  f << line;
  f.flush();
  if (!f) throw Error("shift journal " + path() + ": write failed");
}

void Journal::append(const doc::ShiftEvent& e) {
  json::Json j = doc::to_json(e);
  j["time"] = utc_now_iso8601();
  std::lock_guard lk(mu_);
  append_locked(j);
}

std::vector<std::string> Journal::recover() {
  std::lock_guard lk(mu_);
  // The last event of each shift, in the order the shifts began.
  std::vector<std::string> order;
  std::map<std::string, json::Json> last;
  for (auto& j : read_locked()) {
    const std::string id = j.value("shift_id", "");
    if (!last.count(id)) order.push_back(id);
    last[id] = std::move(j);
  }
  std::vector<std::string> open;
  for (const auto& id : order) {
    json::Json& j = last[id];
    if (j.value("phase", "") == "done") continue;
    const std::string phase = j.value("phase", "");
    j["phase"] = "done";
    j["outcome"] = std::string(doc::to_string(doc::ShiftOutcome::interrupted));
    j["message"] = "interrupted: the daemon stopped during phase " + phase + " (no done event)";
    j["phase_ms"] = 0;
    j["time"] = utc_now_iso8601();
    append_locked(j);
    open.push_back(id);
  }
  return open;
}

std::vector<json::Json> Journal::events() const {
  std::lock_guard lk(mu_);
  return read_locked();
}

json::Json Journal::records() const {
  json::Json out = json::Json::array();
  for (auto& j : events())
    if (j.value("phase", "") == "done") out.push_back(std::move(j));
  return out;
}

std::uint64_t Journal::last_shift_number() const {
  std::uint64_t n = 0;
  for (const auto& j : events()) {
    const std::string id = j.value("shift_id", "");
    if (id.rfind("shift-", 0) == 0) {
      try {
        n = std::max<std::uint64_t>(n, std::stoull(id.substr(6)));
      } catch (const std::exception&) {
      }
    }
  }
  return n;
}

int Journal::skipped_lines() const {
  std::lock_guard lk(mu_);
  return skipped_;
}

}  // namespace ftp::serve
