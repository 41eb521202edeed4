// Status and StatusOr<T>: error values returned across module boundaries (files, configs,
// requests). A Status is either OK or carries a code and a human-readable message that names
// the problem (file, field, offset...). Cheap to move; not thread-safe to share mutably.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace peng {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kDataLoss,       // corrupt or truncated file
  kUnimplemented,  // valid input we do not support (unknown architecture, tensor type)
  kOutOfRange,
  kResourceExhausted,
  kInternal,
  kIoError,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "DataLoss: model.gguf: tensor 'x' extends past end of file"
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
Status InvalidArgument(std::string msg);
Status NotFound(std::string msg);
Status DataLoss(std::string msg);
Status Unimplemented(std::string msg);
Status OutOfRange(std::string msg);
Status ResourceExhausted(std::string msg);
Status Internal(std::string msg);
Status IoError(std::string msg);

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : v_(std::move(status)) { assert(!std::get<Status>(v_).ok()); }
  StatusOr(T value) : v_(std::move(value)) {}

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? OkStatus() : std::get<Status>(v_); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> v_;
};

}  // namespace peng

#define PENG_CONCAT_INNER_(a, b) a##b
#define PENG_CONCAT_(a, b) PENG_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` is not OK.
#define PENG_RETURN_IF_ERROR(expr)          \
  do {                                      \
    ::peng::Status peng_st_ = (expr);       \
    if (!peng_st_.ok()) return peng_st_;    \
  } while (0)

// `PENG_ASSIGN_OR_RETURN(auto x, MakeX());`
#define PENG_ASSIGN_OR_RETURN(lhs, expr) \
  PENG_ASSIGN_OR_RETURN_IMPL_(PENG_CONCAT_(peng_so_, __LINE__), lhs, expr)
#define PENG_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
