// SPDX-License-Identifier: Apache-2.0
#include "hub/fetch.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>

#include "core/error.hpp"
#include "core/json.hpp"
#include "hub/digest.hpp"
#include "hub/http_client.hpp"

namespace ftp::hub {

namespace fs = std::filesystem;

namespace {

constexpr const char* kListing = ".flextp-listing.json";

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool truthy(std::string v) {
  for (auto& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v == "1" || v == "true" || v == "yes" || v == "on";
}

bool is_hex(const std::string& s, std::size_t n) {
  return s.size() == n && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

/// The listing in the hub's own format (what parse_listing reads).
std::string listing_json(const std::vector<RepoFile>& files) {
  json::Json a = json::Json::array();
  for (const auto& f : files) {
    json::Json e = {{"type", "file"}, {"path", f.path}, {"size", f.size}, {"oid", f.git_oid}};
    if (!f.sha256.empty()) e["lfs"] = {{"oid", f.sha256}, {"size", f.size}};
    a.push_back(std::move(e));
  }
  return a.dump(1);
}

void write_atomically(const fs::path& file, const std::string& text) {
  const fs::path tmp = file.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush()) throw Error(tmp.string() + ": write error");
  }
  fs::rename(tmp, file);
}

/// Holds an exclusive flock on a file for its lifetime.
class RepoLock {
 public:
  explicit RepoLock(const fs::path& file) : fd_(::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    if (fd_ < 0 || ::flock(fd_, LOCK_EX) != 0) throw Error(file.string() + ": cannot lock");
  }
  ~RepoLock() { ::close(fd_); }
  RepoLock(const RepoLock&) = delete;
  RepoLock& operator=(const RepoLock&) = delete;

 private:
  int fd_;
};

/// The first file of a selection the folder lacks (absent or another size), or nullptr.
const RepoFile* first_missing(const fs::path& dir, const Selection& s) {
  for (const auto& f : s.files) {
    std::error_code ec;
    if (fs::file_size(dir / f.path, ec) != f.size || ec) return &f;
  }
  return nullptr;
}

fs::path result(const fs::path& dir, const Selection& s) { return s.model_file.empty() ? dir : dir / s.model_file; }

/// URL-escapes each '/'-separated part of a path.
std::string escape_path(const std::string& path) {
  std::string out;
  std::size_t start = 0;
  while (true) {
    const std::size_t end = path.find('/', start);
    const std::string part = path.substr(start, end == std::string::npos ? std::string::npos : end - start);
    for (unsigned char c : part) {
      if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
        out += static_cast<char>(c);
      } else {
        char hex[4];
        std::snprintf(hex, sizeof hex, "%%%02X", c);
        out += hex;
      }
    }
    if (end == std::string::npos) break;
    out += '/';
    start = end + 1;
  }
  return out;
}

std::vector<RepoFile> fetch_listing(HttpClient& http, const ModelRef& ref, const FetchOptions& o) {
  std::string url = o.endpoint + "/api/models/" + ref.repo + "/tree/main?recursive=true";
  std::vector<RepoFile> files;
  std::set<std::string> seen;
  for (int pages = 0; !url.empty(); ++pages) {
    if (pages == 1000) throw Error(ref.text() + ": the listing runs past 1000 pages");
    Page p = http.get(url);
    for (auto& f : parse_listing(ref.repo, p.body))
      if (seen.insert(f.path).second) files.push_back(std::move(f));
    url = p.next;
  }
  return files;
}

void download_one(HttpClient& http, const ModelRef& ref, const FetchOptions& o, const fs::path& dir, const RepoFile& f) {
  const fs::path target = dir / f.path, part = target.string() + ".part";
  fs::create_directories(target.parent_path());
  const std::string url = o.endpoint + "/" + ref.repo + "/resolve/main/" + escape_path(f.path);
  if (o.log) o.log("hub: " + ref.repo + ": downloading " + f.path + " (" + std::to_string(f.size) + " bytes)");
  http.download(url, part, f.size, f.path);
  std::error_code ec;
  const auto got = fs::file_size(part, ec);
  if (ec || got != f.size) {
    fs::remove(part, ec);
    throw Error(ref.text() + ": " + f.path + ": the download has " + std::to_string(got) + " bytes, the hub lists " +
                std::to_string(f.size) + " (removed; run again to fetch it anew)");
  }
  const DigestKind kind = f.sha256.empty() ? DigestKind::git_blob_sha1 : DigestKind::sha256;
  const std::string want = f.sha256.empty() ? f.git_oid : f.sha256;
  const std::string have = file_digest_hex(kind, part);
  if (have != want) {
    fs::remove(part, ec);
    throw Error(ref.text() + ": " + f.path + ": " + digest_name(kind) + " mismatch: the hub lists " + want +
                ", the download has " + have + " (removed; run again to fetch it anew)");
  }
  fs::rename(part, target);
  if (o.log) o.log("hub: " + ref.repo + ": " + f.path + ": " + digest_name(kind) + " " + have + " verified");
}

}  // namespace

FetchOptions options_from_environment() {
  FetchOptions o;
  if (std::string e = env("HF_ENDPOINT"); !e.empty()) {
    while (!e.empty() && e.back() == '/') e.pop_back();
    o.endpoint = e;
  }
  o.token = env("HF_TOKEN");
  o.offline = truthy(env("HF_HUB_OFFLINE"));
  if (std::string x = env("XDG_CACHE_HOME"); !x.empty() && x.front() == '/') {
    o.cache_dir = fs::path(x) / "flextp";
  } else if (std::string h = env("HOME"); !h.empty()) {
    o.cache_dir = fs::path(h) / ".cache" / "flextp";
  } else {
    throw InputError("hf: models need a cache folder: set XDG_CACHE_HOME or HOME");
  }
  o.progress = ::isatty(STDERR_FILENO) == 1;
  return o;
}

std::vector<RepoFile> parse_listing(const std::string& repo, std::string_view text) {
  const std::string src = "hf:" + repo + ": the hub's file listing";
  const json::Json j = json::parse(text, src);
  if (!j.is_array()) throw InputError(src + ": expected a JSON array");
  std::vector<RepoFile> out;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const auto& e = j[i];
    const std::string at = src + ": [" + std::to_string(i) + "]";
    if (!e.is_object()) throw InputError(at + ": expected an object");
    if (e.value("type", std::string("file")) != "file") continue;  // directories
    RepoFile f;
    if (!e.contains("path") || !e["path"].is_string()) throw InputError(at + ".path: expected a string");
    f.path = e["path"].get<std::string>();
    check_repo_path(repo, f.path);
    if (!e.contains("size") || !e["size"].is_number_unsigned()) throw InputError(at + ".size: expected a byte count");
    f.size = e["size"].get<std::uint64_t>();
    if (e.contains("lfs") && e["lfs"].is_object()) {
      const auto& l = e["lfs"];
      f.sha256 = l.contains("oid") && l["oid"].is_string() ? l["oid"].get<std::string>() : "";
      if (!is_hex(f.sha256, 64)) throw InputError(at + ".lfs.oid: expected a sha256 in hex");
      if (l.contains("size") && l["size"].is_number_unsigned()) f.size = l["size"].get<std::uint64_t>();
    } else {
      f.git_oid = e.contains("oid") && e["oid"].is_string() ? e["oid"].get<std::string>() : "";
      if (!is_hex(f.git_oid, 40)) throw InputError(at + ".oid: expected a git blob id (40 hex digits)");
    }
    out.push_back(std::move(f));
  }
  return out;
}

fs::path fetch(const ModelRef& ref, const FetchOptions& o) {
  const fs::path dir = o.cache_dir / "hf" / ref.repo;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(dir.string() + ": cannot create the cache folder: " + ec.message());
  RepoLock lock(dir / ".flextp-lock");
  const fs::path listing_file = dir / kListing;

  // A complete selection from the cached listing: no network call.
  std::string why_not = "nothing of it is in the cache";
  if (fs::exists(listing_file)) {
    const Selection s = select_files(ref, parse_listing(ref.repo, json::read_text(listing_file.string())));
    const RepoFile* miss = first_missing(dir, s);
    if (!miss) {
      if (o.log) o.log("hub: " + ref.text() + ": from the cache " + dir.string());
      return result(dir, s);
    }
    why_not = miss->path + " is not in the cache";
  }
  if (o.offline)
    throw Error(ref.text() + ": offline (HF_HUB_OFFLINE) and " + why_not + " " + dir.string());

  HttpClient http(o.token, o.progress);
  if (o.log) o.log("hub: " + ref.text() + ": listing " + o.endpoint + "/api/models/" + ref.repo);
  const std::vector<RepoFile> listing = fetch_listing(http, ref, o);
  write_atomically(listing_file, listing_json(listing));
  const Selection s = select_files(ref, listing);
  for (const auto& f : s.files) {
    std::error_code e2;
    if (fs::file_size(dir / f.path, e2) == f.size && !e2) continue;
    download_one(http, ref, o, dir, f);
  }
  return result(dir, s);
}

}  // namespace ftp::hub
