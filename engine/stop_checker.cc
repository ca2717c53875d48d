#include "engine/stop_checker.h"

#include <algorithm>
#include <utility>

namespace tandem::engine {
namespace {

bool Contains(absl::Span<const int32_t> ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

std::string_view StopReasonName(StopReason reason) {
  switch (reason) {
    case StopReason::kNone:
      return "none";
    case StopReason::kEos:
      return "eos";
    case StopReason::kStopToken:
      return "stop_token";
    case StopReason::kStopString:
      return "stop_string";
    case StopReason::kLength:
      return "length";
  }
  return "unknown";
}

StopChecker::StopChecker(const StopParams& params, absl::Span<const int32_t> eos_token_ids)
    : params_(params), eos_token_ids_(eos_token_ids.begin(), eos_token_ids.end()) {}

StopUpdate StopChecker::Finish(StopReason reason, std::string text) {
  finish_reason_ = reason;
  held_.clear();
  StopUpdate update;
  update.finish_reason = reason;
  update.text = std::move(text);
  return update;
}

size_t StopChecker::HoldBackLength() const {
  size_t best = 0;
  for (const std::string& stop : params_.stop_strings) {
    if (stop.empty()) continue;  // rejected by Validate()
    // Longer candidates first; the first hit is this stop's longest.
    for (size_t len = std::min(held_.size(), stop.size() - 1); len > best; --len) {
      if (std::string_view(held_).substr(held_.size() - len) ==
          std::string_view(stop).substr(0, len)) {
        best = len;
        break;
      }
    }
  }
  return best;
}

StopUpdate StopChecker::Update(int32_t token_id, std::string_view text_delta) {
  if (finished()) {
    StopUpdate update;
    update.finish_reason = finish_reason_;
    return update;
  }
  ++num_tokens_;
  const bool past_min = num_tokens_ > params_.min_tokens;
  const bool length_reached = params_.max_tokens.has_value() && num_tokens_ >= *params_.max_tokens;

  // Token stops: the token's text is dropped; held text was no stop, release.
  const bool is_eos = !params_.ignore_eos && Contains(eos_token_ids_, token_id);
  if (past_min && (is_eos || Contains(params_.stop_token_ids, token_id))) {
    StopUpdate update =
        Finish(is_eos ? StopReason::kEos : StopReason::kStopToken, std::move(held_));
    update.stop_token_id = token_id;
    return update;
  }

  held_.append(text_delta);
  if (num_tokens_ >= params_.min_tokens) {
    // Earliest match wins: the emitted text is everything before it.
    size_t match = std::string::npos;
    const std::string* matched = nullptr;
    for (const std::string& stop : params_.stop_strings) {
      const size_t pos = stop.empty() ? std::string::npos : held_.find(stop);
      if (pos < match) {
        match = pos;
        matched = &stop;
      }
    }
    if (matched != nullptr) {
      std::string stop_string = *matched;
      StopUpdate update = Finish(StopReason::kStopString, held_.substr(0, match));
      update.stop_string = std::move(stop_string);
      return update;
    }
  }
  if (length_reached) return Finish(StopReason::kLength, std::move(held_));

  const size_t hold = HoldBackLength();
  StopUpdate update;
  update.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return update;
}

std::string StopChecker::Flush() {
  std::string text = std::move(held_);
  held_.clear();
  return text;
}

}  // namespace tandem::engine
