// SPDX-License-Identifier: Apache-2.0
#include "cli/tool.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "core/error.hpp"
#include "core/version.hpp"
#include "ipc/protocol.hpp"

namespace ftp::cli {

bool is_tty(int fd) noexcept { return ::isatty(fd) == 1; }

namespace {

/// A validator that reads the option's text as a finite number and asks
/// `ok` of it; `want` says what it wants ("> 0").
CLI::Validator finite_number(std::function<bool(double)> ok, std::string want) {
  return CLI::Validator(
      [ok = std::move(ok), want](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0') return "expected a number, got '" + text + "'";
        if (!std::isfinite(v)) return "must be a finite number " + want + ", got " + text;
        if (!ok(v)) return "must be " + want + ", got " + text;
        return "";
      },
      want, "finite " + want);
}

std::string number(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.15g", v);
  return b;
}

}  // namespace

CLI::Validator positive() {
  return finite_number([](double v) { return v > 0; }, "> 0");
}

CLI::Validator non_negative() {
  return finite_number([](double v) { return v >= 0; }, ">= 0");
}

CLI::Validator in_range(double lo, double hi) {
  return finite_number([lo, hi](double v) { return v >= lo && v <= hi; }, "in [" + number(lo) + ", " + number(hi) + "]");
}

Tool::Tool(std::string name, std::string description) : name_(std::move(name)), app_(std::move(description), name_) {
  app_.set_version_flag("--version", std::string(name_) + " " + std::string(ftp::version()) +
                                         " (flextp; cuda " + (ftp::built_with_cuda() ? "built" : "not built") + ")",
                        "Print the version and exit");
  // Subcommands (ftp-plan decide, simulate) inherit this: an option of the
  // tool's own (--json) may follow the subcommand too.
  app_.fallthrough();
  app_.add_option("--json", json_opt_, "JSON output style: pretty or short (default: pretty on a terminal, short in a pipe)")
      ->check(CLI::IsMember({"pretty", "short"}))
      ->option_text("pretty|short");
  app_.footer("Exit status: 0 ok, 1 failure, 2 usage error, 3 daemon unreachable, 4 timeout,\n"
              "5 backend (CUDA/NCCL/BLAS) error, 6 a check or threshold failed.\n" +
              // The tools have man pages; the benchmarks are in docs/benchmarks.md.
              (name_.rfind("ftp-", 0) == 0 ? "See " + name_ + "(1)." : std::string("See docs/benchmarks.md.")));
}

json::Style Tool::json_style() const {
  if (json_opt_ == "pretty") return json::Style::pretty;
  if (json_opt_ == "short") return json::Style::short_;
  return is_tty(1) ? json::Style::pretty : json::Style::short_;
}

int Tool::run(int argc, char** argv, const std::function<int()>& body) {
  try {
    app_.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    // The help of the innermost subcommand given ("ftp-plan decide --help").
    const CLI::App* app = &app_;
    while (!app->get_subcommands().empty()) app = app->get_subcommands().front();
    std::cout << app->help() << std::flush;
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app_.help("", CLI::AppFormatMode::All) << std::flush;
    return 0;
  } catch (const CLI::CallForVersion& e) {
    std::cout << e.what() << "\n" << std::flush;
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << name_ << ": error: " << e.what() << "\n"
              << "Try '" << name_ << " --help' for more information.\n";
    return static_cast<int>(Exit::usage);
  }
  try {
    return body();
  } catch (const ftp::Error& e) {
    std::cout.flush();
    std::cerr << name_ << ": error: " << e.what() << "\n";
    return static_cast<int>(e.exit());
  } catch (const std::bad_alloc&) {
    std::cerr << name_ << ": error: out of memory\n";
    return static_cast<int>(Exit::failure);
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << name_ << ": error: " << e.what() << "\n";
    return static_cast<int>(Exit::failure);
  }
}

CLI::Option* Tool::add_socket_option(const std::string& when) {
  return app_.add_option("--socket", socket_,
                         when + "control socket (default $FTP_SOCKET, $XDG_RUNTIME_DIR/flextp/control.sock, "
                                "/run/flextp/control.sock)")
      ->option_text("PATH");
}

std::string Tool::socket_path() const { return socket_.empty() ? ipc::default_socket_path() : socket_; }

void Tool::emit(const json::Json& doc) const {
  std::cout << json::dump(doc, json_style()) << "\n" << std::flush;
}

void Tool::emit_line(const json::Json& doc) const {
  std::cout << json::dump(doc, json::Style::short_) << "\n" << std::flush;
}

void Tool::progress(std::string_view message) const {
  if (!is_tty(2)) return;
  std::cerr << name_ << ": " << message << "\n" << std::flush;
}

void Tool::warn(std::string_view message) const {
  std::cerr << name_ << ": warning: " << message << "\n" << std::flush;
}

}  // namespace ftp::cli
