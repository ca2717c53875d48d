#include "common/tokenizer/chat_template.h"

namespace tandem::tokenizer {
namespace {

// Jinja's `trim` / Python's str.strip() for ASCII whitespace.
std::string_view Trim(std::string_view s) {
  constexpr std::string_view kWs = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(kWs);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kWs) - b + 1);
}

std::string RenderChatML(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                         std::string_view default_system) {
  std::string out;
  if (!default_system.empty() && !messages.empty() && messages[0].role != "system") {
    out.append("<|im_start|>system\n").append(default_system).append("<|im_end|>\n");
  }
  for (const ChatMessage& m : messages) {
    out.append("<|im_start|>").append(m.role).append("\n").append(m.content).append("<|im_end|>\n");
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string RenderLlama3(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out = "<|begin_of_text|>";
  for (const ChatMessage& m : messages) {
    out.append("<|start_header_id|>").append(m.role).append("<|end_header_id|>\n\n");
    out.append(Trim(m.content)).append("<|eot_id|>");
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string RenderLlama2(const std::vector<ChatMessage>& messages) {
  std::string out;
  size_t first = 0;
  std::string system;
  bool has_system = false;
  if (!messages.empty() && messages[0].role == "system") {
    system = messages[0].content;
    has_system = true;
    first = 1;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    std::string content = m.content;
    if (i == first && has_system) {
      content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + m.content;
    }
    if (m.role == "user") {
      out.append("<s>[INST] ").append(Trim(content)).append(" [/INST]");
    } else if (m.role == "assistant") {
      out.append(" ").append(Trim(content)).append(" </s>");
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<ChatFormat> DetectChatFormat(std::string_view t) {
  if (t.empty()) return absl::NotFoundError("model has no chat template");
  if (t.find("<|im_start|>") != std::string_view::npos) return ChatFormat::kChatML;
  if (t.find("<|start_header_id|>") != std::string_view::npos) return ChatFormat::kLlama3;
  if (t.find("[INST]") != std::string_view::npos) return ChatFormat::kLlama2;
  return absl::InvalidArgumentError(
      "unsupported chat template (supported: ChatML, Llama 3, Llama 2 formats)");
}

std::string ExtractDefaultSystem(std::string_view t) {
  // Look for a string literal holding "<|im_start|>system\n...<|im_end|>";
  // the newline may be a real one or a "\n" escape.
  for (std::string_view nl : {std::string_view("\n"), std::string_view("\\n")}) {
    const std::string open = std::string("<|im_start|>system").append(nl);
    const size_t b = t.find(open);
    if (b == std::string_view::npos) continue;
    const size_t start = b + open.size();
    const size_t e = t.find("<|im_end|>", start);
    if (e == std::string_view::npos) continue;
    std::string_view body = t.substr(start, e - start);
    // A template that builds the system turn from a variable is not a literal.
    if (body.find_first_of("'\"{}+") != std::string_view::npos) continue;
    std::string out;
    for (size_t i = 0; i < body.size(); ++i) {
      if (body[i] == '\\' && i + 1 < body.size() && body[i + 1] == 'n') {
        out.push_back('\n');
        ++i;
      } else {
        out.push_back(body[i]);
      }
    }
    return out;
  }
  return "";
}

std::string RenderChat(ChatFormat format, const std::vector<ChatMessage>& messages,
                       bool add_generation_prompt, std::string_view default_system) {
  switch (format) {
    case ChatFormat::kChatML:
      return RenderChatML(messages, add_generation_prompt, default_system);
    case ChatFormat::kLlama3:
      return RenderLlama3(messages, add_generation_prompt);
    case ChatFormat::kLlama2:
      return RenderLlama2(messages);
  }
  return "";
}

}  // namespace tandem::tokenizer
