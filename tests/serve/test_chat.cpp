// SPDX-License-Identifier: Apache-2.0
// Chat templates: detection of each family from a real-world Jinja template
// and the text each renders.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "serve/chat.hpp"

using namespace ftp::serve;

namespace {

const std::vector<ChatMessage> conv = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Name a fruit."}};

// Abridged from the templates these models ship in tokenizer.chat_template.
const char* llama2_jinja =
    "{% if messages[0]['role'] == 'system' %}{% set system_message = '<<SYS>>\\n' + messages[0]['content'] + "
    "'\\n<</SYS>>\\n\\n' %}{% endif %}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content + ' [/INST]' }}{% endif %}{% endfor %}";
const char* chatml_jinja =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
const char* llama3_jinja =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{{ content }}{% endfor %}";
const char* zephyr_jinja =
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + eos_token "
    "}}{% elif message['role'] == 'assistant' %}{{ '<|assistant|>\\n' + message['content'] + eos_token }}{% endif %}"
    "{% endfor %}";
const char* phi3_jinja =
    "{% for message in messages %}{% if message['role'] == 'user' %}{{'<|user|>' + '\\n' + message['content'] + "
    "'<|end|>' + '\\n' + '<|assistant|>' + '\\n'}}{% endif %}{% endfor %}";
// Gemma's (google/gemma-2-2b-it tokenizer_config.json), abridged.
const char* gemma_jinja =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | "
    "trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}";

}  // namespace

TEST(ChatTemplate, Gemma) {
  EXPECT_EQ(detect_chat_template(gemma_jinja), ChatTemplate::gemma);
  EXPECT_STREQ(chat_template_name(ChatTemplate::gemma), "gemma");
  // Written by hand from the template: trimmed contents, the system text
  // opening the first user turn (llama.cpp's rule, Gemma has no system role).
  EXPECT_EQ(render_chat(ChatTemplate::gemma, conv),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
            "<start_of_turn>user\nName a fruit.<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_TRUE(chat_stop_strings(ChatTemplate::gemma).empty());
}

TEST(ChatTemplate, DetectsEachFamily) {
  EXPECT_EQ(detect_chat_template(llama2_jinja), ChatTemplate::llama2);
  EXPECT_EQ(detect_chat_template(chatml_jinja), ChatTemplate::chatml);
  EXPECT_EQ(detect_chat_template(llama3_jinja), ChatTemplate::llama3);
  EXPECT_EQ(detect_chat_template(zephyr_jinja), ChatTemplate::zephyr);
  EXPECT_EQ(detect_chat_template(phi3_jinja), ChatTemplate::phi3);
  EXPECT_EQ(detect_chat_template(""), ChatTemplate::plain);
  EXPECT_EQ(detect_chat_template("{{ messages | tojson }}"), ChatTemplate::plain);
  EXPECT_STREQ(chat_template_name(ChatTemplate::llama3), "llama3");
  EXPECT_STREQ(chat_template_name(ChatTemplate::plain), "plain");
}

TEST(ChatTemplate, Plain) {
  EXPECT_EQ(render_chat(ChatTemplate::plain, conv),
            "System: Be brief.\nUser: Hi\nAssistant: Hello!\nUser: Name a fruit.\nAssistant:");
  EXPECT_EQ(chat_stop_strings(ChatTemplate::plain), std::vector<std::string>{"\nUser:"});
}

TEST(ChatTemplate, Llama2) {
  EXPECT_EQ(render_chat(ChatTemplate::llama2, conv),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Name a fruit. [/INST]");
  EXPECT_EQ(render_chat(ChatTemplate::llama2, {{"user", "Hi"}}), "[INST] Hi [/INST]");
  EXPECT_TRUE(chat_stop_strings(ChatTemplate::llama2).empty());
}

TEST(ChatTemplate, ChatML) {
  EXPECT_EQ(render_chat(ChatTemplate::chatml, conv),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nName a fruit.<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplate, Llama3) {
  EXPECT_EQ(render_chat(ChatTemplate::llama3, {{"system", "S"}, {"user", "U"}}),
            "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, ZephyrAndPhi3) {
  EXPECT_EQ(render_chat(ChatTemplate::zephyr, {{"system", "S"}, {"user", "U"}, {"assistant", "A"}, {"user", "V"}}),
            "<|system|>\nS</s>\n<|user|>\nU</s>\n<|assistant|>\nA</s>\n<|user|>\nV</s>\n<|assistant|>\n");
  EXPECT_EQ(render_chat(ChatTemplate::phi3, {{"user", "U"}}), "<|user|>\nU<|end|>\n<|assistant|>\n");
}

TEST(ChatTemplate, BadRoleIsAnInputError) {
  try {
    render_chat(ChatTemplate::chatml, {{"user", "U"}, {"tool", "x"}});
    FAIL() << "no error";
  } catch (const ftp::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("messages[1].role"), std::string::npos) << e.what();
  }
}
