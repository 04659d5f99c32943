// Status helpers: the macros Debian's Abseil (20220623) lacks, written once for the project.
//
// TS_RETURN_IF_ERROR(expr): evaluates an absl::Status expression and returns it if not OK.
// TS_ASSIGN_OR_RETURN(lhs, expr): evaluates an absl::StatusOr<T>; returns its status if not OK,
// otherwise moves the value into lhs (which may be a declaration, e.g. `auto x`).
// TS_CHECK(cond): a programmer-error assertion that stays on in release builds. It never
// validates input from the network, the chain or the disk; those return a Status.
#ifndef TS_COMMON_STATUS_H_
#define TS_COMMON_STATUS_H_

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TS_STATUS_CONCAT_INNER_(a, b) a##b
#define TS_STATUS_CONCAT_(a, b) TS_STATUS_CONCAT_INNER_(a, b)

#define TS_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status ts_status_ = (expr);      \
    if (!ts_status_.ok()) return ts_status_; \
  } while (0)

#define TS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return std::move(tmp).status();  \
  lhs = std::move(tmp).value()  // NOLINT(bugprone-macro-parentheses): lhs may declare

#define TS_ASSIGN_OR_RETURN(lhs, expr) \
  TS_ASSIGN_OR_RETURN_IMPL_(TS_STATUS_CONCAT_(ts_statusor_, __LINE__), lhs, expr)

#define TS_CHECK(cond)                                                              \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

#endif  // TS_COMMON_STATUS_H_
