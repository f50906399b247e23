#pragma once
/// \file
/// medfast's exceptions and its one check macro.
///
/// Low layers state the facts (operation, path, offset, size, expected vs
/// actual, strerror); callers add context ("while loading sample 3") with
/// Error::add_context as the exception travels up. The library never prints
/// and never aborts: the CLI catches Error and prints what() as one line.

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace medfast {

/// Base class of every exception medfast throws.
class Error : public std::runtime_error {
 public:
  explicit Error(std::string message) : std::runtime_error(message), message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }
  /// The whole message, with the context callers added (add_context): what() as a string.
  const std::string& message() const noexcept { return message_; }
  /// Prefixes the message with caller context: "context: message".
  Error& add_context(const std::string& context);

 private:
  std::string message_;
};

/// A system call failed; errno_value() is the errno it reported.
class OsError : public Error {
 public:
  OsError(std::string message, int errno_value) : Error(std::move(message)), errno_(errno_value) {}
  int errno_value() const noexcept { return errno_; }

 private:
  int errno_;
};

/// Input data (a file, a header, a config value) is not what was expected.
class FormatError : public Error {
 public:
  using Error::Error;
};

/// An argument or option has a value outside what is allowed.
class ValueError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

/// Builds a message from any streamable parts: str("read ", n, " bytes").
template <typename... Args>
std::string str(Args&&... args) {
  return detail::concat(std::forward<Args>(args)...);
}

/// The items with `sep` between them, for messages: join({"a", "b"}) is "a, b".
std::string join(const std::vector<std::string>& items, const std::string& sep = ", ");
/// `s` in lowercase (ASCII): names matched as MONAI matches them, ignoring case.
std::string lowercase(std::string s);

/// Whether `s` ends with `suffix` (".gz", ".nii.gz").
inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// The message of any exception, without the C++ backtrace that libtorch's
/// c10::Error appends to what() ("\nException raised from ...").
std::string message_of(const std::exception& e);

/// Rethrows the current medfast::Error with context prepended; other
/// exceptions (libtorch's included) become an Error with their message_of().
[[noreturn]] void rethrow_with_context(const std::string& context);

/// Runs f(); an exception leaves with `context` prepended (rethrow_with_context).
template <typename F>
auto with_context(const std::string& context, F&& f) {
  try {
    return f();
  } catch (...) {
    rethrow_with_context(context);
  }
}

}  // namespace medfast

/// MEDFAST_CHECK(cond, parts...): throws medfast::Error with the parts
/// concatenated. The message is only built when the check fails.
#define MEDFAST_CHECK(cond, ...)                                       \
  do {                                                                 \
    if (!(cond)) throw ::medfast::Error(::medfast::str(__VA_ARGS__)); \
  } while (0)

/// Same as MEDFAST_CHECK with a chosen exception type (FormatError, ValueError).
#define MEDFAST_CHECK_T(type, cond, ...)                              \
  do {                                                                \
    if (!(cond)) throw ::medfast::type(::medfast::str(__VA_ARGS__)); \
  } while (0)
