// Helpers of the fuzz targets: UTF-8 validity, and the tokenizers they load
// once per process: the bundled SmolLM2
// (byte-level BPE; models/, installed by scripts/bootstrap.sh) and the
// committed tiny SentencePiece model (tests/data/tiny_spm.gguf).
#ifndef TANDEM_TESTS_FUZZ_FUZZ_MODELS_H_
#define TANDEM_TESTS_FUZZ_FUZZ_MODELS_H_

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/gguf/gguf.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/vocab.h"
#include "common/utf8.h"

namespace tandem::fuzz {

// True when every byte of `s` belongs to a well-formed UTF-8 sequence.
inline bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8::ValidUtf8Len(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

struct FuzzTokenizer {
  std::unique_ptr<gguf::GgufFile> file;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
};

inline std::unique_ptr<FuzzTokenizer> LoadFuzzTokenizer(const std::string& path) {
  auto file = gguf::GgufFile::Open(path);
  if (!file.ok()) return nullptr;
  auto vocab = tokenizer::VocabFromGguf(**file);
  if (!vocab.ok()) return nullptr;
  auto tok = tokenizer::Tokenizer::Create(*std::move(vocab));
  if (!tok.ok()) return nullptr;
  auto out = std::make_unique<FuzzTokenizer>();
  out->file = std::move(*file);
  out->tokenizer = std::move(*tok);
  return out;
}

// Both tokenizers; aborts when the committed tiny model cannot load (a
// broken checkout), skips SmolLM2 when the model is not installed.
inline const std::vector<std::unique_ptr<FuzzTokenizer>>& FuzzTokenizers() {
  static const auto* all = [] {
    auto* v = new std::vector<std::unique_ptr<FuzzTokenizer>>();
    const std::string root = TANDEM_SOURCE_DIR;
    if (auto t = LoadFuzzTokenizer(root + "/tests/data/tiny_spm.gguf")) {
      v->push_back(std::move(t));
    } else {
      std::fprintf(stderr, "fuzz: cannot load tests/data/tiny_spm.gguf\n");
      std::abort();
    }
    if (auto t = LoadFuzzTokenizer(root + "/models/SmolLM2-135M-Instruct.Q4_1.gguf")) {
      v->push_back(std::move(t));
    }
    return v;
  }();
  return *all;
}

}  // namespace tandem::fuzz

#endif  // TANDEM_TESTS_FUZZ_FUZZ_MODELS_H_
