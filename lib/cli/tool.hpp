// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

#include "core/json.hpp"

namespace ftp::cli {

/// The frame every tool shares (STYLE.md conventions): CLI11 parsing,
/// `--help` on stdout, `--version`, `--json=pretty|short`, errors as
/// "ftp-X: error: ..." on stderr and the exit codes of STYLE.md.
/// A tool's main() builds one Tool, adds its options, and calls run().
class Tool {
 public:
  Tool(std::string name, std::string description);

  CLI::App& app() noexcept { return app_; }
  const std::string& name() const noexcept { return name_; }

  /// --json as given, else pretty when stdout is a terminal, short otherwise.
  json::Style json_style() const;

  /// Parses argv, then calls body. Maps CLI11 errors to exit 2, ftp::Error to
  /// its exit code, any other exception to 1. Returns main()'s exit code.
  int run(int argc, char** argv, const std::function<int()>& body);

  /// Adds --socket PATH (the daemon's control socket); `when` prefixes the
  /// help text ("With --watch: "). See socket_path().
  CLI::Option* add_socket_option(const std::string& when = "");
  /// --socket as given, else ipc::default_socket_path() ($FTP_SOCKET,
  /// $XDG_RUNTIME_DIR/flextp/control.sock, /run/flextp/control.sock).
  std::string socket_path() const;

  /// Writes one JSON document (or one JSON Lines record) to stdout, newline, flush.
  void emit(const json::Json& doc) const;
  /// Like emit, always on one line (for JSON Lines streams).
  void emit_line(const json::Json& doc) const;

  /// Progress for people on stderr; silent unless stderr is a terminal.
  void progress(std::string_view message) const;
  /// A warning on stderr: "ftp-X: warning: ...".
  void warn(std::string_view message) const;

 private:
  std::string name_;
  CLI::App app_;
  std::string json_opt_;
  std::string socket_;
};

/// True when the stream (1 = stdout, 2 = stderr) is a terminal.
bool is_tty(int fd) noexcept;

/// Checks of numeric options, to use instead of CLI11's PositiveNumber,
/// NonNegativeNumber and Range: those compare with <, so NaN passes them
/// (a --min-throughput nan gate would never fail), and their messages
/// print a range of 300 digits. These refuse NaN and infinities and say
/// what they want: "--timeout: must be a finite number > 0, got nan".
CLI::Validator positive();                      ///< finite, > 0
CLI::Validator non_negative();                  ///< finite, >= 0
CLI::Validator in_range(double lo, double hi);  ///< finite, in [lo, hi]

}  // namespace ftp::cli
