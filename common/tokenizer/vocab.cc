#include "common/tokenizer/vocab.h"

#include <algorithm>
#include <climits>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tandem::tokenizer {
namespace {

constexpr std::string_view kModelKey = "tokenizer.ggml.model";
constexpr std::string_view kTokensKey = "tokenizer.ggml.tokens";
constexpr std::string_view kScoresKey = "tokenizer.ggml.scores";
constexpr std::string_view kTypesKey = "tokenizer.ggml.token_type";
constexpr std::string_view kMergesKey = "tokenizer.ggml.merges";

absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status KeyError(std::string_view key, const absl::Status& s) {
  return absl::InvalidArgumentError(absl::StrCat("GGUF key ", Av(key), ": ", s.message()));
}

// Optional special-token id: -1 when the key is absent.
absl::StatusOr<int32_t> ReadId(const gguf::GgufFile& f, std::string_view key, int32_t n) {
  if (f.Find(key) == nullptr) return -1;
  auto v = f.GetInt(key);
  if (!v.ok()) return KeyError(key, v.status());
  // Some converters write -1 (as int32) or 0xFFFFFFFF for "none".
  if (*v == -1 || *v == 0xFFFFFFFFll) return -1;
  if (*v < 0 || *v >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF key ", Av(key), ": token id ", *v, " out of range [0, ", n, ")"));
  }
  return static_cast<int32_t>(*v);
}

absl::StatusOr<bool> ReadBool(const gguf::GgufFile& f, std::string_view key, bool def) {
  auto v = f.GetBoolOr(key, def);
  if (!v.ok()) return KeyError(key, v.status());
  return *v;
}

absl::StatusOr<std::vector<std::string>> ReadStrings(const gguf::GgufFile& f,
                                                     std::string_view key) {
  auto arr = f.GetArray(key);
  if (!arr.ok()) return KeyError(key, arr.status());
  std::vector<std::string> out;
  out.reserve((*arr)->size());
  for (const gguf::Value& v : **arr) {
    auto s = v.AsString();
    if (!s.ok()) return KeyError(key, s.status());
    out.emplace_back(*s);
  }
  return out;
}

void AddEog(Vocab& v) {
  // Turn terminators of common chat formats; llama.cpp treats the same set as
  // end-of-generation when present.
  static constexpr std::string_view kEogTexts[] = {
      "<|eot_id|>", "<|im_end|>",    "<|end|>",         "<end_of_turn>",
      "<|eom_id|>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
  };
  auto add = [&v](int32_t id) {
    if (id < 0) return;
    for (int32_t e : v.eog_ids) {
      if (e == id) return;
    }
    v.eog_ids.push_back(id);
  };
  add(v.eos_id);
  for (int32_t id = 0; id < v.size(); ++id) {
    for (std::string_view t : kEogTexts) {
      if (v.tokens[id] == t) add(id);
    }
  }
}

}  // namespace

absl::Status ValidateVocab(const Vocab& v) {
  const int64_t n = static_cast<int64_t>(v.tokens.size());
  if (n == 0) return absl::InvalidArgumentError("vocab: no tokens");
  if (n > INT32_MAX) return absl::InvalidArgumentError("vocab: too many tokens");
  if (static_cast<int64_t>(v.scores.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab: ", v.scores.size(), " scores for ", n, " tokens"));
  }
  if (static_cast<int64_t>(v.token_types.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab: ", v.token_types.size(), " token types for ", n, " tokens"));
  }
  for (int32_t id : {v.bos_id, v.eos_id, v.unk_id, v.pad_id}) {
    if (id < -1 || id >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("vocab: special token id ", id, " out of range [0, ", n, ")"));
    }
  }
  for (int32_t id : v.eog_ids) {
    if (id < 0 || id >= n) {
      return absl::InvalidArgumentError(absl::StrCat("vocab: eog id ", id, " out of range"));
    }
  }
  if (v.add_bos && v.bos_id < 0) return absl::InvalidArgumentError("vocab: add_bos without bos");
  if (v.add_eos && v.eos_id < 0) return absl::InvalidArgumentError("vocab: add_eos without eos");
  for (TokenType t : v.token_types) {
    if (static_cast<int32_t>(t) < 0 || static_cast<int32_t>(t) > 6) {
      return absl::InvalidArgumentError(
          absl::StrCat("vocab: unknown token type ", static_cast<int32_t>(t)));
    }
  }
  if (v.kind == VocabKind::kBpe) {
    if (v.merges.empty()) return absl::InvalidArgumentError("vocab: BPE vocab without merges");
    absl::flat_hash_map<absl::string_view, int32_t> ids;
    ids.reserve(v.tokens.size());
    for (int32_t i = 0; i < n; ++i) ids.emplace(absl::string_view(v.tokens[i]), i);
    for (size_t r = 0; r < v.merges.size(); ++r) {
      const std::string& m = v.merges[r];
      const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
      if (sp == std::string::npos || sp + 1 >= m.size()) {
        return absl::InvalidArgumentError(absl::StrCat("vocab: merge ", r, " is malformed"));
      }
      const absl::string_view left = absl::string_view(m).substr(0, sp);
      const absl::string_view right = absl::string_view(m).substr(sp + 1);
      if (!ids.contains(left) || !ids.contains(right)) {
        return absl::InvalidArgumentError(
            absl::StrCat("vocab: merge ", r, " (\"", m, "\") names an unknown token"));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// The optional per-token scores and types (absent: 0 and kNormal); each,
// when present, has exactly n entries.
absl::Status ReadScoresAndTypes(const gguf::GgufFile& f, int64_t n, Vocab& v) {
  v.scores.assign(n, 0.0f);
  if (f.Find(kScoresKey) != nullptr) {
    auto arr = f.GetArray(kScoresKey);
    if (!arr.ok()) return KeyError(kScoresKey, arr.status());
    if (static_cast<int64_t>((*arr)->size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat("GGUF key ", Av(kScoresKey), ": ",
                                                     (*arr)->size(), " entries, expected ", n));
    }
    for (int64_t i = 0; i < n; ++i) {
      auto s = (**arr)[i].AsFloat();
      if (!s.ok()) return KeyError(kScoresKey, s.status());
      v.scores[i] = static_cast<float>(*s);
    }
  }
  v.token_types.assign(n, TokenType::kNormal);
  if (f.Find(kTypesKey) != nullptr) {
    auto arr = f.GetArray(kTypesKey);
    if (!arr.ok()) return KeyError(kTypesKey, arr.status());
    if (static_cast<int64_t>((*arr)->size()) != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF key ", Av(kTypesKey), ": ", (*arr)->size(), " entries, expected ", n));
    }
    for (int64_t i = 0; i < n; ++i) {
      auto t = (**arr)[i].AsInt();
      if (!t.ok()) return KeyError(kTypesKey, t.status());
      if (*t < 0 || *t > 6) {
        return absl::InvalidArgumentError(
            absl::StrCat("GGUF key ", Av(kTypesKey), ": token ", i, " has unknown type ", *t));
      }
      v.token_types[i] = static_cast<TokenType>(*t);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Vocab> VocabFromGguf(const gguf::GgufFile& f) {
  Vocab v;
  auto model = f.GetString(kModelKey);
  if (!model.ok()) return KeyError(kModelKey, model.status());
  if (*model == "gpt2") {
    v.kind = VocabKind::kBpe;
  } else if (*model == "llama") {
    v.kind = VocabKind::kSpm;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported tokenizer model \"", Av(*model), "\" (supported: gpt2, llama)"));
  }
  if (f.Find("tokenizer.ggml.pre") != nullptr) {
    auto pre = f.GetString("tokenizer.ggml.pre");
    if (!pre.ok()) return KeyError("tokenizer.ggml.pre", pre.status());
    v.pre = std::string(*pre);
  }
  TANDEM_ASSIGN_OR_RETURN(v.tokens, ReadStrings(f, kTokensKey));
  const auto n = static_cast<int64_t>(v.tokens.size());
  if (n == 0 || n > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF key ", Av(kTokensKey), ": bad size ", n));
  }

  TANDEM_RETURN_IF_ERROR(ReadScoresAndTypes(f, n, v));
  if (v.kind == VocabKind::kBpe) {
    TANDEM_ASSIGN_OR_RETURN(v.merges, ReadStrings(f, kMergesKey));
  }

  const auto n32 = static_cast<int32_t>(n);
  TANDEM_ASSIGN_OR_RETURN(v.bos_id, ReadId(f, "tokenizer.ggml.bos_token_id", n32));
  TANDEM_ASSIGN_OR_RETURN(v.eos_id, ReadId(f, "tokenizer.ggml.eos_token_id", n32));
  TANDEM_ASSIGN_OR_RETURN(v.unk_id, ReadId(f, "tokenizer.ggml.unknown_token_id", n32));
  TANDEM_ASSIGN_OR_RETURN(v.pad_id, ReadId(f, "tokenizer.ggml.padding_token_id", n32));
  TANDEM_ASSIGN_OR_RETURN(int32_t eot_id, ReadId(f, "tokenizer.ggml.eot_token_id", n32));
  TANDEM_ASSIGN_OR_RETURN(int32_t eom_id, ReadId(f, "tokenizer.ggml.eom_token_id", n32));

  // Defaults follow llama.cpp: SentencePiece models add BOS and a space
  // prefix; byte-level BPE models do not, except the Llama 3 family.
  const bool spm = v.kind == VocabKind::kSpm;
  const bool bpe_bos = v.pre == "llama-bpe" || v.pre == "llama3" || v.pre == "falcon3";
  TANDEM_ASSIGN_OR_RETURN(v.add_bos, ReadBool(f, "tokenizer.ggml.add_bos_token", spm || bpe_bos));
  TANDEM_ASSIGN_OR_RETURN(v.add_eos, ReadBool(f, "tokenizer.ggml.add_eos_token", false));
  TANDEM_ASSIGN_OR_RETURN(v.add_space_prefix, ReadBool(f, "tokenizer.ggml.add_space_prefix", spm));
  if (v.add_bos && v.bos_id < 0) v.add_bos = false;
  if (v.add_eos && v.eos_id < 0) v.add_eos = false;

  if (f.Find("tokenizer.chat_template") != nullptr) {
    auto t = f.GetString("tokenizer.chat_template");
    if (!t.ok()) return KeyError("tokenizer.chat_template", t.status());
    v.chat_template = std::string(*t);
  }
  AddEog(v);
  for (int32_t id : {eot_id, eom_id}) {
    if (id >= 0 && std::find(v.eog_ids.begin(), v.eog_ids.end(), id) == v.eog_ids.end()) {
      v.eog_ids.push_back(id);
    }
  }
  TANDEM_RETURN_IF_ERROR(ValidateVocab(v));
  return v;
}

}  // namespace tandem::tokenizer
