// SPDX-License-Identifier: Apache-2.0
// lib/hub without a network: references, the listing, the selection rules,
// path checks and the digests (against published values).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.hpp"
#include "hub/digest.hpp"
#include "hub/fetch.hpp"
#include "hub/model_ref.hpp"

using namespace ftp;
using namespace ftp::hub;

namespace {

RepoFile file(std::string path, std::uint64_t size = 1) {
  RepoFile f;
  f.path = std::move(path);
  f.size = size;
  return f;
}

std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(HubRef, Parses) {
  EXPECT_TRUE(is_hub_ref("hf:a/b"));
  EXPECT_FALSE(is_hub_ref("models/a.gguf"));
  ModelRef r = parse_ref("hf:ggml-org/tiny_llamas.v2");
  EXPECT_EQ(r.repo, "ggml-org/tiny_llamas.v2");
  EXPECT_EQ(r.pattern, "");
  r = parse_ref("hf:Org/Repo-GGUF:*Q4_K_M.gguf");
  EXPECT_EQ(r.repo, "Org/Repo-GGUF");
  EXPECT_EQ(r.pattern, "*Q4_K_M.gguf");
  EXPECT_EQ(r.text(), "hf:Org/Repo-GGUF:*Q4_K_M.gguf");
}

TEST(HubRef, RefusesBadNames) {
  EXPECT_NE(error_of([] { parse_ref("hf:noslash"); }).find("no '/'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_ref("hf:../x"); }).find("ORG '..'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_ref("hf:a/b c"); }).find("REPO 'b c'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_ref("hf:a/b:"); }).find("empty FILE"), std::string::npos);
  EXPECT_NE(error_of([] { parse_ref("hf:a/b/c"); }).find("REPO 'b/c'"), std::string::npos);
  EXPECT_EQ(error_of([] { parse_ref("hf:a/b"); }), "");
}

TEST(HubSelect, OneGgufByDefault) {
  const std::vector<RepoFile> l = {file("README.md"), file("m.Q8_0.gguf")};
  Selection s = select_files(parse_ref("hf:a/b"), l);
  ASSERT_EQ(s.files.size(), 1u);
  EXPECT_EQ(s.model_file, "m.Q8_0.gguf");
}

TEST(HubSelect, Q4KMAmongSeveral) {
  const std::vector<RepoFile> l = {file("m.Q8_0.gguf"), file("m.Q4_K_M.gguf"), file("m.Q2_K.gguf")};
  EXPECT_EQ(select_files(parse_ref("hf:a/b"), l).model_file, "m.Q4_K_M.gguf");
  const std::vector<RepoFile> l2 = {file("m.Q8_0.gguf"), file("m.Q2_K.gguf")};
  const std::string e = error_of([&] { select_files(parse_ref("hf:a/b"), l2); });
  EXPECT_NE(e.find("name the file to serve, hf:a/b:FILE; its GGUF files: m.Q8_0.gguf, m.Q2_K.gguf"), std::string::npos) << e;
}

TEST(HubSelect, PatternAndExactName) {
  const std::vector<RepoFile> l = {file("m.Q8_0.gguf"), file("m.Q4_K_M.gguf"), file("sub/m.Q4_K_M.gguf")};
  Selection s = select_files(parse_ref("hf:a/b:*Q4_K_M.gguf"), l);
  ASSERT_EQ(s.files.size(), 1u);  // '*' does not cross '/'
  EXPECT_EQ(s.model_file, "m.Q4_K_M.gguf");
  EXPECT_EQ(select_files(parse_ref("hf:a/b:sub/m.Q4_K_M.gguf"), l).model_file, "sub/m.Q4_K_M.gguf");
  const std::string e = error_of([&] { select_files(parse_ref("hf:a/b:x.gguf"), l); });
  EXPECT_NE(e.find("no file of the repository matches 'x.gguf'"), std::string::npos) << e;
}

TEST(HubSelect, FolderWithoutGguf) {
  const std::vector<RepoFile> l = {file("config.json"), file("model-00001-of-00002.safetensors"),
                                   file("model-00002-of-00002.safetensors"), file("model.safetensors.index.json"),
                                   file("tokenizer.json"), file("README.md"), file("pytorch_model.bin"),
                                   file("onnx/model.onnx")};
  Selection s = select_files(parse_ref("hf:a/b"), l);
  EXPECT_EQ(s.model_file, "");  // the folder
  std::vector<std::string> paths;
  for (const auto& f : s.files) paths.push_back(f.path);
  EXPECT_EQ(paths, (std::vector<std::string>{"config.json", "model-00001-of-00002.safetensors",
                                             "model-00002-of-00002.safetensors", "model.safetensors.index.json",
                                             "tokenizer.json"}));
  // A pattern picks any files; with a non-GGUF among them the model is the folder.
  s = select_files(parse_ref("hf:a/b:*.json"), l);
  EXPECT_EQ(s.files.size(), 3u);
  EXPECT_EQ(s.model_file, "");
}

TEST(HubPaths, RefusesEscapes) {
  check_repo_path("a/b", "x/y.gguf");
  for (const char* p : {"/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a\\b", ""})
    EXPECT_NE(error_of([&] { check_repo_path("a/b", p); }).find("hf:a/b: the hub lists the path"), std::string::npos) << p;
}

TEST(HubListing, ParsesTheTreeApi) {
  const std::string sha(64, 'a'), oid(40, 'b');
  const std::string text = R"([{"type":"directory","oid":")" + oid + R"(","size":0,"path":"sub"},
    {"type":"file","oid":")" + oid + R"(","size":12,"path":"config.json"},
    {"type":"file","oid":")" + oid + R"(","size":134,"path":"sub/m.gguf","lfs":{"oid":")" + sha +
                           R"(","size":1234567,"pointerSize":134}}])";
  const auto files = parse_listing("a/b", text);
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].path, "config.json");
  EXPECT_EQ(files[0].git_oid, oid);
  EXPECT_EQ(files[0].sha256, "");
  EXPECT_EQ(files[1].path, "sub/m.gguf");
  EXPECT_EQ(files[1].size, 1234567u);  // the LFS object's size, not the pointer's
  EXPECT_EQ(files[1].sha256, sha);
}

TEST(HubListing, RefusesBadEntries) {
  EXPECT_NE(error_of([] { parse_listing("a/b", "{}"); }).find("expected a JSON array"), std::string::npos);
  EXPECT_NE(error_of([] { parse_listing("a/b", R"([{"type":"file","path":"x","size":-1}])"); }).find("[0].size"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_listing("a/b", R"([{"type":"file","path":"x","size":1,"oid":"zz"}])"); }).find("[0].oid"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_listing("a/b", R"([{"type":"file","path":"x","size":1,"lfs":{"oid":"12"}}])"); })
                .find("[0].lfs.oid"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_listing("a/b", R"([{"type":"file","path":"../x","size":1,"oid":")" +
                                                      std::string(40, '0') + R"("}])"); })
                .find("'../x'"),
            std::string::npos);
}

TEST(HubDigest, PublishedValues) {
  // FIPS 180-2's "abc" and the empty string; git's ids of "hello\n" and the empty blob.
  EXPECT_EQ(digest_hex(DigestKind::sha256, "abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(digest_hex(DigestKind::sha256, ""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(digest_hex(DigestKind::git_blob_sha1, "hello\n"), "ce013625030ba8dba906f756967f9e9ca394464a");
  EXPECT_EQ(digest_hex(DigestKind::git_blob_sha1, ""), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
  const auto p = std::filesystem::temp_directory_path() / "ftp-test-hub-digest";
  { std::ofstream(p, std::ios::binary) << "hello\n"; }
  EXPECT_EQ(file_digest_hex(DigestKind::git_blob_sha1, p), "ce013625030ba8dba906f756967f9e9ca394464a");
  std::filesystem::remove(p);
}

TEST(HubOptions, Environment) {
  setenv("HF_ENDPOINT", "http://127.0.0.1:9/", 1);
  setenv("HF_TOKEN", "hf_x", 1);
  setenv("HF_HUB_OFFLINE", "1", 1);
  setenv("XDG_CACHE_HOME", "/tmp/xdg", 1);
  FetchOptions o = options_from_environment();
  EXPECT_EQ(o.endpoint, "http://127.0.0.1:9");
  EXPECT_EQ(o.token, "hf_x");
  EXPECT_TRUE(o.offline);
  EXPECT_EQ(o.cache_dir, std::filesystem::path("/tmp/xdg/flextp"));
  unsetenv("HF_ENDPOINT");
  unsetenv("HF_HUB_OFFLINE");
  unsetenv("XDG_CACHE_HOME");
  setenv("HOME", "/home/u", 1);
  o = options_from_environment();
  EXPECT_EQ(o.endpoint, "https://huggingface.co");
  EXPECT_FALSE(o.offline);
  EXPECT_EQ(o.cache_dir, std::filesystem::path("/home/u/.cache/flextp"));
}
