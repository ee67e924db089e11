// SPDX-License-Identifier: Apache-2.0
#pragma once

// Chat prompts: the conversation of /v1/chat/completions rendered as the text
// a model was trained on. The template comes from the model's GGUF metadata
// (tokenizer.chat_template, a Jinja program); instead of running Jinja we
// recognise the common families by their markers and render them by hand,
// as llama.cpp's llm_chat_apply_template does:
//
//   family   marker in the template      one turn
//   llama2   [INST]                      [INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>
//   chatml   <|im_start|>                <|im_start|>{role}\n{content}<|im_end|>\n
//   llama3   <|start_header_id|>         <|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>
//   zephyr   <|user|> (without <|end|>)  <|{role}|>\n{content}</s>\n
//   phi3     <|user|> and <|end|>        <|{role}|>\n{content}<|end|>\n
//   gemma    <start_of_turn>             <start_of_turn>{user|model}\n{content}<end_of_turn>\n
//            (no system role: system text opens the next user turn)
//   plain    (absent or unknown)         System: {system}\nUser: {user}\nAssistant: {assistant}\n
//
// The rendered text never starts with BOS: the tokenizer adds it (add_bos).
// It is meant to be tokenised with parse_special, so that the markers become
// their control tokens.

#include <string>
#include <string_view>
#include <vector>

namespace ftp::serve {

enum class ChatTemplate { plain, llama2, chatml, llama3, zephyr, phi3, gemma };

/// One message of a conversation. role: "system", "user" or "assistant"
/// ("developer" is read as "system" by the HTTP layer).
struct ChatMessage {
  std::string role;
  std::string content;
};

/// The family of a Jinja chat template; plain when empty or not recognised.
ChatTemplate detect_chat_template(std::string_view jinja);

/// "plain", "llama2", "chatml", "llama3", "zephyr", "phi3", "gemma".
const char* chat_template_name(ChatTemplate t) noexcept;

/// The prompt text of a conversation, ending with the opening of the
/// assistant's turn. Throws ftp::InputError for a role other than system,
/// user or assistant.
std::string render_chat(ChatTemplate t, const std::vector<ChatMessage>& messages);

/// Stop strings a template needs beyond the tokenizer's end-of-generation
/// tokens: for plain, "\nUser:" (the model would go on writing the user's
/// next turn); none for the others, whose turns end with a control token.
std::vector<std::string> chat_stop_strings(ChatTemplate t);

}  // namespace ftp::serve
