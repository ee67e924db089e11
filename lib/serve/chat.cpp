// SPDX-License-Identifier: Apache-2.0
#include "serve/chat.hpp"

#include "core/error.hpp"

namespace ftp::serve {

namespace {

bool has(std::string_view s, std::string_view needle) { return s.find(needle) != std::string_view::npos; }

void check_role(const ChatMessage& m, std::size_t i) {
  if (m.role != "system" && m.role != "user" && m.role != "assistant")
    throw InputError("messages[" + std::to_string(i) + "].role: expected system, user or assistant, got '" + m.role + "'");
}

std::string render_llama2(const std::vector<ChatMessage>& msgs) {
  // System messages go inside the next [INST] block, as Meta's template does.
  std::string out, system;
  bool first = true;
  for (const auto& m : msgs) {
    if (m.role == "system") {
      if (!system.empty()) system += "\n\n";
      system += m.content;
    } else if (m.role == "user") {
      if (!first) out += "<s>";
      out += "[INST] ";
      if (!system.empty()) out += "<<SYS>>\n" + system + "\n<</SYS>>\n\n";
      out += m.content + " [/INST]";
      system.clear();
      first = false;
    } else {
      out += " " + m.content + " </s>";
      first = false;
    }
  }
  if (!system.empty()) {  // a conversation of only system messages
    if (!first) out += "<s>";
    out += "[INST] <<SYS>>\n" + system + "\n<</SYS>>\n\n [/INST]";
  }
  return out;
}

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\n\r");
  if (b == std::string_view::npos) return "";
  return std::string(s.substr(b, s.find_last_not_of(" \t\n\r") - b + 1));
}

std::string render_gemma(const std::vector<ChatMessage>& msgs) {
  // As llama.cpp's LLM_CHAT_TEMPLATE_GEMMA: contents trimmed, system text
  // merged into the next user turn, "assistant" called "model".
  std::string out, system;
  for (const auto& m : msgs) {
    if (m.role == "system") {
      system += trim(m.content);
      continue;
    }
    const std::string role = m.role == "assistant" ? "model" : m.role;
    out += "<start_of_turn>" + role + "\n";
    if (!system.empty() && role != "model") {
      out += system + "\n\n";
      system.clear();
    }
    out += trim(m.content) + "<end_of_turn>\n";
  }
  return out + "<start_of_turn>model\n";
}

}  // namespace

ChatTemplate detect_chat_template(std::string_view jinja) {
  if (has(jinja, "<|start_header_id|>")) return ChatTemplate::llama3;
  if (has(jinja, "<|im_start|>")) return ChatTemplate::chatml;
  if (has(jinja, "<start_of_turn>")) return ChatTemplate::gemma;
  if (has(jinja, "[INST]")) return ChatTemplate::llama2;
  if (has(jinja, "<|user|>")) return has(jinja, "<|end|>") ? ChatTemplate::phi3 : ChatTemplate::zephyr;
  return ChatTemplate::plain;
}

const char* chat_template_name(ChatTemplate t) noexcept {
  switch (t) {
    case ChatTemplate::plain: return "plain";
    case ChatTemplate::llama2: return "llama2";
    case ChatTemplate::chatml: return "chatml";
    case ChatTemplate::llama3: return "llama3";
    case ChatTemplate::zephyr: return "zephyr";
    case ChatTemplate::phi3: return "phi3";
    case ChatTemplate::gemma: return "gemma";
  }
  return "plain";
}

std::string render_chat(ChatTemplate t, const std::vector<ChatMessage>& msgs) {
  for (std::size_t i = 0; i < msgs.size(); ++i) check_role(msgs[i], i);
  std::string out;
  switch (t) {
    case ChatTemplate::llama2:
      return render_llama2(msgs);
    case ChatTemplate::chatml:
      for (const auto& m : msgs) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      return out + "<|im_start|>assistant\n";
    case ChatTemplate::llama3:
      for (const auto& m : msgs)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
    case ChatTemplate::zephyr:
      for (const auto& m : msgs) out += "<|" + m.role + "|>\n" + m.content + "</s>\n";
      return out + "<|assistant|>\n";
    case ChatTemplate::phi3:
      for (const auto& m : msgs) out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
      return out + "<|assistant|>\n";
    case ChatTemplate::gemma:
      return render_gemma(msgs);
    case ChatTemplate::plain:
      break;
  }
  for (const auto& m : msgs) {
    const char* who = m.role == "system" ? "System: " : m.role == "user" ? "User: " : "Assistant: ";
    out += who + m.content + "\n";
  }
  return out + "Assistant:";
}

std::vector<std::string> chat_stop_strings(ChatTemplate t) {
  if (t == ChatTemplate::plain) return {"\nUser:"};
  return {};
}

}  // namespace ftp::serve
