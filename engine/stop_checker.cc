#include "engine/stop_checker.h"

#include <algorithm>
#include <utility>

namespace tandem::engine {
namespace {

bool Contains(absl::Span<const int32_t> ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

StopChecker::StopChecker(const StopParams& params, absl::Span<const int32_t> eos_token_ids)
    : params_(params), eos_token_ids_(eos_token_ids.begin(), eos_token_ids.end()) {}

StopUpdate StopChecker::Finish(FinishReason reason, std::string text, int32_t stop_token_id,
                               std::string stop_string) {
  finish_ = reason;
  held_.clear();
  stop_token_id_ = stop_token_id;
  stop_string_ = std::move(stop_string);
  StopUpdate update;
  update.finish = reason;
  update.stop_token_id = stop_token_id_;
  update.stop_string = stop_string_;
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
    update.finish = finish_;
    update.stop_token_id = stop_token_id_;
    update.stop_string = stop_string_;
    return update;
  }
  ++num_tokens_;
  const bool past_min = num_tokens_ > params_.min_tokens;
  const bool length_reached = params_.max_tokens.has_value() && num_tokens_ >= *params_.max_tokens;

  // Token stops: the token's text is dropped; held text was no stop, release.
  const bool is_eos = !params_.ignore_eos && Contains(eos_token_ids_, token_id);
  if (past_min && (is_eos || Contains(params_.stop_token_ids, token_id))) {
    return Finish(is_eos ? FinishReason::kEos : FinishReason::kStop, std::move(held_), token_id);
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
      std::string stop_string = *matched;  // held_ is cleared by Finish
      return Finish(FinishReason::kStop, held_.substr(0, match), -1, std::move(stop_string));
    }
  }
  if (length_reached) return Finish(FinishReason::kLength, std::move(held_));

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
