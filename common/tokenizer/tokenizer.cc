#include "common/tokenizer/tokenizer.h"

#include <algorithm>

#include "absl/strings/str_replace.h"
#include "common/status.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/spm.h"
#include "common/tokenizer/unicode.h"

namespace tandem::tokenizer {
namespace {

constexpr const char* kSpmSpace = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

// A piece of the input: raw text, or a special token found in it.
struct Fragment {
  std::string_view text;
  int32_t token = -1;  // >= 0: a special token
};

// "<0x4A>" -> 0x4A; -1 when `text` is not of that form.
int ParseByteToken(std::string_view text) {
  if (text.size() != 6 || !text.starts_with("<0x") || text[5] != '>') return -1;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    const int d = (c >= '0' && c <= '9')   ? c - '0'
                  : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                  : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                           : -1;
    if (d < 0) return -1;
    value = value * 16 + d;
  }
  return value;
}

}  // namespace

Tokenizer::Tokenizer(Vocab vocab) : vocab_(std::move(vocab)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(Vocab vocab) {
  TANDEM_RETURN_IF_ERROR(ValidateVocab(vocab));
  std::unique_ptr<Tokenizer> t(new Tokenizer(std::move(vocab)));
  const Vocab& v = t->vocab_;
  const int32_t n = v.size();
  t->index_.reserve(n);
  t->pieces_.resize(n);
  t->is_eog_.assign(n, false);
  for (int32_t id = 0; id < n; ++id) {
    t->index_.try_emplace(v.tokens[id], id);  // first id wins on duplicate text
    const TokenType type = v.token_types[id];
    const std::string& text = v.tokens[id];
    std::string& piece = t->pieces_[id];
    if (type == TokenType::kControl || type == TokenType::kUnknown ||
        type == TokenType::kUserDefined) {
      piece = text;
      if (!text.empty()) t->special_tokens_.push_back(id);
    } else if (v.kind == VocabKind::kBpe) {
      piece = ByteLevelToBytes(text);
    } else if (int byte = ParseByteToken(text); type == TokenType::kByte && byte >= 0) {
      piece = std::string(1, static_cast<char>(byte));
    } else {
      piece = absl::StrReplaceAll(text, {{kSpmSpace, " "}});
    }
  }
  std::stable_sort(t->special_tokens_.begin(), t->special_tokens_.end(),
                   [&v](int32_t a, int32_t b) { return v.tokens[a].size() > v.tokens[b].size(); });
  for (int32_t id : v.eog_ids) t->is_eog_[id] = true;

  if (v.kind == VocabKind::kBpe) {
    TANDEM_ASSIGN_OR_RETURN(t->pre_, PreTokenizer::Create(v.pre));
    t->bpe_ = std::make_unique<BpeEncoder>(v, t->index_, t->pre_->ignore_merges());
  } else {
    t->spm_ = std::make_unique<SpmEncoder>(v, t->index_);
  }
  return t;
}

void Tokenizer::EncodeText(std::string_view text, bool after_special,
                           std::vector<int32_t>* out) const {
  if (vocab_.kind == VocabKind::kBpe) {
    std::vector<std::string_view> words;
    pre_->Split(text, &words);
    for (std::string_view w : words) bpe_->EncodeWord(w, out);
    return;
  }
  // llama.cpp: a space goes in front of the text at the start and after
  // every special token.
  std::string escaped;
  if (vocab_.add_space_prefix && after_special) escaped = kSpmSpace;
  escaped += absl::StrReplaceAll(absl::string_view(text.data(), text.size()), {{" ", kSpmSpace}});
  spm_->Encode(escaped, out);
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  // Split at special-token text, longest token first (as llama.cpp does).
  std::vector<Fragment> frags{{text, -1}};
  std::vector<Fragment> next;
  for (int32_t id : special_tokens_) {
    const TokenType type = vocab_.token_types[id];
    if (!parse_special && type != TokenType::kUserDefined) continue;
    const std::string& st = vocab_.tokens[id];
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token >= 0 || f.text.size() < st.size()) {
        next.push_back(f);
        continue;
      }
      size_t pos = 0;
      for (size_t hit; (hit = f.text.find(st, pos)) != std::string_view::npos;
           pos = hit + st.size()) {
        if (hit > pos) next.push_back({f.text.substr(pos, hit - pos), -1});
        next.push_back({{}, id});
      }
      if (pos < f.text.size()) next.push_back({f.text.substr(pos), -1});
    }
    frags.swap(next);
  }

  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special && vocab_.add_bos) out.push_back(vocab_.bos_id);
  bool after_special = true;
  for (const Fragment& f : frags) {
    if (f.token >= 0) {
      out.push_back(f.token);
      after_special = true;
    } else if (!f.text.empty()) {
      EncodeText(f.text, after_special, &out);
      after_special = false;
    }
  }
  if (add_special && vocab_.add_eos) out.push_back(vocab_.eos_id);
  return out;
}

bool Tokenizer::strips_leading_space() const {
  return vocab_.kind == VocabKind::kSpm && vocab_.add_space_prefix;
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special) const {
  std::string out;
  bool at_start = true;  // no text token seen yet
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    const bool special = IsSpecial(id);
    if (special && skip_special) continue;
    std::string_view piece = pieces_[id];
    if (!special && at_start) {
      if (strips_leading_space() && piece.starts_with(' ')) piece.remove_prefix(1);
      at_start = false;
    }
    out.append(piece);
  }
  return out;
}

std::string Tokenizer::TokenToPiece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  return pieces_[id];
}

bool Tokenizer::IsEog(int32_t id) const { return id >= 0 && id < vocab_size() && is_eog_[id]; }

bool Tokenizer::IsSpecial(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return false;
  const TokenType t = vocab_.token_types[id];
  return t == TokenType::kControl || t == TokenType::kUnknown;
}

std::optional<int32_t> Tokenizer::FindToken(std::string_view piece) const {
  auto it = index_.find(piece);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

}  // namespace tandem::tokenizer
