// exitscope/status.h: the error type every fallible exitscope call returns.
//
// Fallible calls return `Result<T>`: a T or an Error, never both. An Error carries a code the
// C API maps to an integer status and a one-line message that names the input (file, line,
// offset, flag) and what is wrong, fit to print as is. No exitscope API throws.
//
// Result is this library's own small class (C++20), not std::expected (C++23), so that a VMM
// built as C++20 can include every public header. It reads like std::expected:
//
//   Result<int> ParsePort(std::string_view s) {
//     if (s.empty()) return Fail(ErrorCode::kInvalidArgument, "--port: empty");
//     return 8080;
//   }
//   Status Setup() {
//     auto port = ParsePort(flag);
//     if (!port) return Propagate(port);  // pass the error on, unchanged
//     use(*port);
//     return {};                          // Status (Result<void>): success
//   }
//
// `EXITSCOPE_RETURN_IF_ERROR(expr)` does the same for a call whose value is not needed.
// A Result also accepts any error wrapper with an `error()` member and no `has_value()`, such as
// C++23's std::unexpected<Error>, so C++23 code that spells `std::unexpected(r.error())` keeps
// compiling.
#pragma once

#include <concepts>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

// The library itself is C++23; callers inside it may still spell std::unexpected.
#if __cplusplus > 202002L && __has_include(<expected>)
#include <expected>
#endif

namespace exitscope {

enum class ErrorCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // bad parameter or bad input (maps to CLI exit status 2)
  kAlreadyExists = 2,    // e.g. overlapping registration
  kNotFound = 3,
  kCorrupt = 4,      // malformed or truncated input file
  kUnsupported = 5,  // e.g. a dump from a future format version
  kIo = 6,           // open/read/write failure (errno in the message)
  kUnavailable = 7,  // a kernel facility missing here (/dev/kvm, tracefs)
  kPermission = 8,
  kInternal = 9,
};

struct Error {
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
};

// The error side of a Result, on its way to one: `return Unexpected(err);`. Fail() builds one.
class Unexpected {
 public:
  explicit Unexpected(Error error) : error_(std::move(error)) {}
  Error& error() & noexcept { return error_; }
  const Error& error() const& noexcept { return error_; }
  Error&& error() && noexcept { return std::move(error_); }

 private:
  Error error_;
};

namespace result_internal {

// A foreign error wrapper (std::unexpected<Error>): has error(), is not itself a result.
template <typename W>
concept ErrorWrapper = !std::same_as<std::remove_cvref_t<W>, Unexpected> && !requires(const W& w) {
  w.has_value();
}
&&requires(W&& w) {
  { std::forward<W>(w).error() } -> std::convertible_to<Error>;
};

[[noreturn]] inline void DieOnError(const Error& e) noexcept {
  std::fprintf(stderr, "exitscope: value() of a failed Result: %s\n", e.message.c_str());
  std::abort();
}

}  // namespace result_internal

// A T or an Error. Reading the value of a failed Result (or the error of a good one) is a
// programming error: value() aborts with the message; operator* and operator-> do not check.
template <typename T>
class [[nodiscard]] Result {
 public:
  using value_type = T;
  using error_type = Error;

  Result() requires std::is_default_constructible_v<T> : v_(std::in_place_index<0>) {}
  Result(Unexpected u) : v_(std::in_place_index<1>, std::move(u).error()) {}
  template <typename W>
  requires result_internal::ErrorWrapper<W> &&
      (!std::same_as<std::remove_cvref_t<W>, T>)Result(W&& w)
      : v_(std::in_place_index<1>, std::forward<W>(w).error()) {}
  template <typename U = T>
  requires(!std::same_as<std::remove_cvref_t<U>, Result> &&
           !std::same_as<std::remove_cvref_t<U>, Unexpected> &&
           !std::same_as<std::remove_cvref_t<U>, std::in_place_t> &&
           (std::same_as<std::remove_cvref_t<U>, T> ||
            !result_internal::ErrorWrapper<
                U>)&&std::is_constructible_v<T, U&&>) explicit(!std::is_convertible_v<U&&, T>)
      Result(U&& value)
      : v_(std::in_place_index<0>, std::forward<U>(value)) {}
  template <typename... Args>
  explicit Result(std::in_place_t, Args&&... args)
      : v_(std::in_place_index<0>, std::forward<Args>(args)...) {}

  bool has_value() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  T& operator*() & noexcept { return *std::get_if<0>(&v_); }
  const T& operator*() const& noexcept { return *std::get_if<0>(&v_); }
  T&& operator*() && noexcept { return std::move(*std::get_if<0>(&v_)); }
  T* operator->() noexcept { return std::get_if<0>(&v_); }
  const T* operator->() const noexcept { return std::get_if<0>(&v_); }

  T& value() & {
    Check();
    return **this;
  }
  const T& value() const& {
    Check();
    return **this;
  }
  T&& value() && {
    Check();
    return std::move(**this);
  }
  template <typename U>
  T value_or(U&& other) const& {
    return has_value() ? **this : static_cast<T>(std::forward<U>(other));
  }
  template <typename U>
  T value_or(U&& other) && {
    return has_value() ? std::move(**this) : static_cast<T>(std::forward<U>(other));
  }

  Error& error() & noexcept { return *std::get_if<1>(&v_); }
  const Error& error() const& noexcept { return *std::get_if<1>(&v_); }
  Error&& error() && noexcept { return std::move(*std::get_if<1>(&v_)); }

 private:
  void Check() const {
    if (!has_value()) result_internal::DieOnError(*std::get_if<1>(&v_));
  }
  std::variant<T, Error> v_;
};

// Result<void>: success or an Error. `return {};` for success.
template <>
class [[nodiscard]] Result<void> {
 public:
  using value_type = void;
  using error_type = Error;

  Result() = default;
  Result(Unexpected u) : error_(std::move(u).error()), failed_(true) {}
  template <typename W>
  requires result_internal::ErrorWrapper<W> Result(W&& w)
      : error_(std::forward<W>(w).error()), failed_(true) {}

  bool has_value() const noexcept { return !failed_; }
  explicit operator bool() const noexcept { return has_value(); }
  void operator*() const noexcept {}
  void value() const {
    if (failed_) result_internal::DieOnError(error_);
  }

  Error& error() & noexcept { return error_; }
  const Error& error() const& noexcept { return error_; }
  Error&& error() && noexcept { return std::move(error_); }

 private:
  Error error_;  // meaningful only when failed_
  bool failed_ = false;
};

// Status is Result<void>: `return {};` for success.
using Status = Result<void>;

[[nodiscard]] inline Unexpected Fail(ErrorCode code, std::string message) {
  return Unexpected(Error{code, std::move(message)});
}

// Passes a failed result's error on, unchanged: `if (!r) return Propagate(r);`.
template <typename T>
[[nodiscard]] Unexpected Propagate(const Result<T>& failed) {
  return Unexpected(failed.error());
}
template <typename T>
[[nodiscard]] Unexpected Propagate(Result<T>&& failed) {
  return Unexpected(std::move(failed).error());
}

}  // namespace exitscope

// Evaluates `expr` (a Result or Status) and returns its error from the enclosing function if it
// failed; its value, if any, is dropped.
#define EXITSCOPE_RETURN_IF_ERROR(expr)                            \
  do {                                                             \
    if (auto exitscope_status_ = (expr); !exitscope_status_) {     \
      return ::exitscope::Propagate(std::move(exitscope_status_)); \
    }                                                              \
  } while (false)
