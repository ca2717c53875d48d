#include "common/tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/unicode.h"

namespace tandem::tokenizer {
namespace {

// GPT-2's pattern. The trailing `|\s+` of the original is not needed here:
// unmatched text becomes a piece anyway.
constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
// Llama 3 (tiktoken cl100k style): case-insensitive contractions, digit runs
// of at most three, newlines kept with the punctuation before them.
constexpr const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen 2: as Llama 3 but every digit alone.
constexpr const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kDigit = R"(\p{N})";

struct PreConfig {
  std::vector<const char*> patterns;
  bool ignore_merges = false;
};

bool Lookup(std::string_view pre, PreConfig* c) {
  // SmolLM2, StarCoder & co.: HF's Digits(individual_digits) then ByteLevel.
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r" ||
      pre == "codeshell" || pre == "exaone" || pre == "minerva-7b") {
    *c = {{kDigit, kGpt2}, false};
  } else if (pre == "gpt2" || pre == "mpt" || pre == "olmo" || pre == "jais") {
    *c = {{kGpt2}, false};
  } else if (pre == "llama-bpe" || pre == "llama3" || pre == "dbrx" || pre == "smaug-bpe") {
    *c = {{kLlama3}, true};
  } else if (pre == "qwen2" || pre == "stablelm2") {
    *c = {{kQwen2}, false};
  } else if (pre.empty() || pre == "default") {
    *c = {{R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}, false};
  } else {
    return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(std::string_view pre) {
  PreConfig config;
  if (!Lookup(pre, &config)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported pre-tokenizer \"", absl::string_view(pre.data(), pre.size()),
                     "\" (tokenizer.ggml.pre; supported: smollm, gpt2, llama-bpe, qwen2, ...)"));
  }
  std::unique_ptr<PreTokenizer> p(new PreTokenizer());
  p->ignore_merges_ = config.ignore_merges;
  for (const char* pattern : config.patterns) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_off, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return absl::InternalError(absl::StrCat(
          "pre-tokenizer regex: ", reinterpret_cast<const char*>(msg), " at ", err_off));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort: falls back to the interpreter
    p->codes_.push_back(code);
  }
  return p;
}

PreTokenizer::~PreTokenizer() {
  for (void* c : codes_) pcre2_code_free(static_cast<pcre2_code*>(c));
}

void PreTokenizer::SplitOne(const void* code_ptr, std::string_view piece,
                            std::vector<std::string_view>* out) const {
  const auto* code = static_cast<const pcre2_code*>(code_ptr);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  size_t emitted = 0;  // end of the last piece appended
  size_t start = 0;
  while (start < piece.size()) {
    const int rc = pcre2_match(code, subject, piece.size(), start, 0, md, nullptr);
    if (rc < 0) break;  // no match (or a resource limit): the rest is one piece
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t m_begin = ov[0], m_end = ov[1];
    if (m_end <= m_begin) {  // empty match: step over one character
      const size_t len = ValidUtf8Len(piece, m_begin);
      start = m_begin + (len == 0 ? 1 : len);
      continue;
    }
    if (m_begin > emitted) out->push_back(piece.substr(emitted, m_begin - emitted));
    out->push_back(piece.substr(m_begin, m_end - m_begin));
    emitted = start = m_end;
  }
  if (emitted < piece.size()) out->push_back(piece.substr(emitted));
  pcre2_match_data_free(md);
}

void PreTokenizer::Split(std::string_view text, std::vector<std::string_view>* out) const {
  if (text.empty()) return;
  std::vector<std::string_view> pieces{text};
  std::vector<std::string_view> next;
  for (const void* code : codes_) {
    next.clear();
    for (std::string_view p : pieces) SplitOne(code, p, &next);
    pieces.swap(next);
  }
  out->insert(out->end(), pieces.begin(), pieces.end());
}

}  // namespace tandem::tokenizer
