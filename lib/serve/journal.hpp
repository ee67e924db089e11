// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/json.hpp"
#include "doc/control.hpp"

namespace ftp::serve {

/// The shift journal (issue 20, item 5): every shift event appended as one
/// JSON line (ftp.shift-event/v1 plus "time", the wall clock in ISO 8601
/// UTC) to `shifts.jsonl` in the daemon's state directory, rotated by size
/// to shifts.jsonl.1 .. .<keep> (the oldest dropped). History survives a
/// restart; a shift whose last event is not `done` was interrupted (a
/// crash mid-shift) and recover() closes it. Thread-safe.
class Journal {
 public:
  /// Creates `dir` if needed; throws InputError naming it when it cannot
  /// be created or written.
  explicit Journal(std::string dir, std::uint64_t max_bytes = 4u << 20, int keep = 4);

  /// At start: the shifts the journal left open get a `done` event with
  /// outcome interrupted, appended now; returns their ids (for the log).
  std::vector<std::string> recover();
  /// Appends one event (flushed before returning).
  void append(const doc::ShiftEvent& e);
  /// Every event still kept, oldest first, each with its "time".
  std::vector<json::Json> events() const;
  /// The closing (`done`) records, oldest first, with "time".
  json::Json records() const;
  /// The largest N of the ids "shift-N" in the journal (0: none).
  std::uint64_t last_shift_number() const;
  /// Lines the last read skipped as malformed (a torn last write).
  int skipped_lines() const;

  const std::string& dir() const noexcept { return dir_; }
  /// The current file.
  std::string path() const;

 private:
  std::vector<json::Json> read_locked() const;
  void append_locked(const json::Json& line);
  std::string dir_;
  std::uint64_t max_bytes_;
  int keep_;
  mutable std::mutex mu_;
  mutable int skipped_ = 0;
};

/// The wall clock now, ISO 8601 UTC with milliseconds ("2026-12-02T04:05:06.789Z").
std::string utc_now_iso8601();

}  // namespace ftp::serve
