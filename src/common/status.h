// Status and Result<T>: expected failures inside erun (a bad discovery line, a
// host that cannot be reached, a timeout) travel as values, not exceptions.
// Both are [[nodiscard]]: a dropped failure is a compile warning.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "common/check.h"

namespace erun {

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(std::string message) { return Status(std::move(message)); }

  bool is_ok() const { return !message_.has_value(); }
  explicit operator bool() const { return is_ok(); }
  const std::string& message() const {
    static const std::string kEmpty;
    return message_ ? *message_ : kEmpty;
  }

 private:
  explicit Status(std::string m) : message_(std::move(m)) {}
  std::optional<std::string> message_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) { ERUN_CHECK(!std::get<Status>(v_).is_ok()); }
  static Result error(std::string message) { return Result(Status::error(std::move(message))); }

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const std::string& message() const {
    static const std::string kEmpty;
    return is_ok() ? kEmpty : std::get<Status>(v_).message();
  }
  Status status() const { return is_ok() ? Status::ok() : std::get<Status>(v_); }

  T& value() & { ERUN_CHECK(is_ok()); return std::get<T>(v_); }
  const T& value() const& { ERUN_CHECK(is_ok()); return std::get<T>(v_); }
  T&& value() && { ERUN_CHECK(is_ok()); return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace erun
