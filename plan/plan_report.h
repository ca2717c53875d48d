// Renders a Plan for people (an aligned table) and for programs (one JSON
// object, every output a named field). Both are pure functions of their
// arguments; `measured` is null without --measured.
#ifndef TANDEM_PLAN_PLAN_REPORT_H_
#define TANDEM_PLAN_PLAN_REPORT_H_

#include <string>

#include "plan/capacity_plan.h"
#include "plan/measured.h"

namespace tandem::plan {

std::string FormatPlanTable(const PlanInputs& in, const Plan& plan,
                            const MeasuredComparison* measured);

// One line, no trailing newline. Field names are stable (docs/plan.md).
std::string FormatPlanJson(const PlanInputs& in, const Plan& plan,
                           const MeasuredComparison* measured);

// 1234567 -> "1,234,567".
std::string WithCommas(int64_t v);

}  // namespace tandem::plan

#endif  // TANDEM_PLAN_PLAN_REPORT_H_
