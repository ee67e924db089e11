// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <stdexcept>
#include <string>

namespace ftp {

/// Exit codes shared by every tool (STYLE.md, "Exit codes"), also used to
/// classify library errors so that a tool can map an error to its exit code.
enum class Exit : int {
  ok = 0,
  failure = 1,       ///< generic failure
  usage = 2,         ///< bad command line or bad input document
  unreachable = 3,   ///< daemon or control socket unreachable
  timeout = 4,       ///< an operation ran out of time
  backend = 5,       ///< CUDA, NCCL or BLAS error
  check_failed = 6,  ///< a check or threshold failed (rollback, bench gate)
};

/// The one exception type library code throws at its boundaries. The message
/// says what failed, where and why; it never starts with the tool name, which
/// the tool adds when it reports the error.
class Error : public std::runtime_error {
 public:
  explicit Error(std::string message, Exit exit = Exit::failure)
      : std::runtime_error(std::move(message)), exit_(exit) {}
  Exit exit() const noexcept { return exit_; }

 private:
  Exit exit_;
};

/// Invalid input (a document, a spec, an option value): exit code 2.
class InputError : public Error {
 public:
  explicit InputError(std::string message) : Error(std::move(message), Exit::usage) {}
};

/// A backend (BLAS, CUDA, NCCL) failure: exit code 5.
class BackendError : public Error {
 public:
  explicit BackendError(std::string message) : Error(std::move(message), Exit::backend) {}
};

}  // namespace ftp
