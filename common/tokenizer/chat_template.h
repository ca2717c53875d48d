// Chat prompt formats. Tandem does not run Jinja: it recognises the model's
// tokenizer.chat_template by its markers and renders the matching format in
// C++, producing exactly the text the reference templates produce
// (tests/data/chat_templates.json holds goldens rendered with jinja2).
//
// The rendered text contains special-token text (<|im_start|>, and the BOS
// text for Llama 3 / Llama 2, whose templates emit it): encode it with
// Encode(text, /*add_special=*/false, /*parse_special=*/true).
//
// Thread safety: pure functions.
#ifndef TANDEM_COMMON_TOKENIZER_CHAT_TEMPLATE_H_
#define TANDEM_COMMON_TOKENIZER_CHAT_TEMPLATE_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::tokenizer {

enum class ChatFormat {
  kChatML,  // <|im_start|>role\ncontent<|im_end|>\n (SmolLM2, Qwen 2)
  kLlama3,  // <|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
  kLlama2,  // <s>[INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST] answer </s>
};

struct ChatMessage {
  std::string role;  // "system" | "user" | "assistant" (others rendered as given)
  std::string content;
};

// By markers: "<|im_start|>" -> kChatML, "<|start_header_id|>" -> kLlama3,
// "[INST]" -> kLlama2. NotFound for an empty template, InvalidArgument for
// one with none of the markers.
absl::StatusOr<ChatFormat> DetectChatFormat(std::string_view jinja_template);

// The system prompt a ChatML template injects when the first message is not
// a system message (SmolLM2: "You are a helpful AI assistant named SmolLM,
// trained by Hugging Face"); "" when the template has none.
std::string ExtractDefaultSystem(std::string_view jinja_template);

// Renders `messages`. add_generation_prompt appends the assistant header
// (ChatML, Llama 3; the Llama 2 template has none). `default_system` is used
// by ChatML when messages[0] is not a system message ("" = none).
// Llama 3 and Llama 2 trim the content of every message, as their templates
// do; Llama 2 folds a leading system message into the first user turn and
// renders only user/assistant turns after it.
std::string RenderChat(ChatFormat format, const std::vector<ChatMessage>& messages,
                       bool add_generation_prompt, std::string_view default_system = "");

}  // namespace tandem::tokenizer

#endif  // TANDEM_COMMON_TOKENIZER_CHAT_TEMPLATE_H_
