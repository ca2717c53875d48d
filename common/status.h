// Status helpers shared by every module.
//
// Contract: functions that can fail on untrusted input (files, network, flags)
// return absl::Status / absl::StatusOr and never assert. TANDEM_CHECK is for
// internal invariants only: a failure there is a bug in Tandem.
#ifndef TANDEM_COMMON_STATUS_H_
#define TANDEM_COMMON_STATUS_H_

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TANDEM_STATUS_CONCAT_INNER_(a, b) a##b
#define TANDEM_STATUS_CONCAT_(a, b) TANDEM_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` is not OK.
#define TANDEM_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status tandem_status_ = (expr);          \
    if (!tandem_status_.ok()) return tandem_status_; \
  } while (0)

// `lhs` = value of the StatusOr `rexpr`, or returns its error.
#define TANDEM_ASSIGN_OR_RETURN(lhs, rexpr) \
  TANDEM_ASSIGN_OR_RETURN_IMPL_(TANDEM_STATUS_CONCAT_(tandem_statusor_, __LINE__), lhs, rexpr)
#define TANDEM_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();       \
  lhs = std::move(tmp).value()

// Internal invariant. Never use on untrusted input.
#define TANDEM_CHECK(cond)                                                                 \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "%s:%d: TANDEM_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

#endif  // TANDEM_COMMON_STATUS_H_
