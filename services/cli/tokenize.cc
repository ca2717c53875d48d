// `tandem tokenize`: the model's tokenizer on a text, as ids (one JSON object
// with --json), like llama.cpp's llama-tokenize.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/json.h"
#include "common/utf8.h"
#include "services/cli/args.h"
#include "services/cli/commands.h"
#include "services/cli/model_loader.h"

namespace tandem::cli {
namespace {

// A token piece for the terminal: valid UTF-8 as is, control characters and
// bytes of partial code points as \xNN.
std::string Printable(std::string_view piece) {
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    const size_t len = utf8::ValidUtf8Len(piece, i);
    const auto c = static_cast<unsigned char>(piece[i]);
    if (len > 1 || (len == 1 && c >= 0x20 && c != 0x7F)) {
      out.append(piece.substr(i, len));
      i += len;
    } else {
      out += absl::StrFormat("\\x%02X", c);
      ++i;
    }
  }
  return out;
}

}  // namespace

int RunTokenize(int argc, char** argv) {
  std::string model_flag, text;
  bool json = false, no_special = false, add_special = true;
  ArgParser parser("tokenize", "Prints the token ids of a text under the model's tokenizer.");
  parser.AddString("model", &model_flag, "GGUF model path (default: as for generate)");
  parser.AddString("prompt", &text, "text to tokenize (required)");
  parser.AddBool("no-parse-special", &no_special,
                 "treat special-token text such as <|im_start|> as plain text");
  parser.AddBool("add-special", &add_special,
                 "add BOS/EOS when the model's metadata asks for them");
  parser.AddBool("json", &json, "print {\"token_ids\": [...], \"pieces\": [...]}");
  if (absl::Status s = parser.Parse(argc, argv, 2); !s.ok()) {
    std::fprintf(stderr, "tandem tokenize: %s\n", std::string(s.message()).c_str());
    return kExitUsage;
  }
  if (parser.help_requested()) {
    std::fputs(parser.Help().c_str(), stdout);
    return kExitOk;
  }
  if (!parser.WasSet("prompt")) {
    std::fprintf(stderr, "tandem tokenize: --prompt is required\n");
    return kExitUsage;
  }
  auto path = ResolveModelPath(model_flag);
  if (!path.ok()) {
    std::fprintf(stderr, "tandem tokenize: %s\n", std::string(path.status().message()).c_str());
    return kExitUsage;
  }
  auto loaded = LoadTokenizer(*path);
  if (!loaded.ok()) {
    std::fprintf(stderr, "tandem tokenize: %s\n", std::string(loaded.status().message()).c_str());
    return kExitUsage;
  }
  const tokenizer::Tokenizer& tok = *loaded->tokenizer;
  const std::vector<int32_t> ids = tok.Encode(text, add_special, !no_special);
  if (json) {
    json::OrderedJson pieces = json::OrderedJson::array();
    for (int32_t id : ids) pieces.push_back(tok.TokenToPiece(id));
    const json::OrderedJson line = {{"token_ids", ids}, {"pieces", pieces}};
    std::printf("%s\n", json::Dump(line).c_str());
  } else {
    for (int32_t id : ids) {
      std::printf("%6d -> '%s'\n", id, Printable(tok.TokenToPiece(id)).c_str());
    }
  }
  return kExitOk;
}

}  // namespace tandem::cli
