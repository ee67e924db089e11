// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ftp::hub {

/// A model on a Hugging Face hub: `hf:ORG/REPO[:FILE]`, FILE a path in the
/// repository or a glob (`*Q4_K_M.gguf`, `*.safetensors`).
struct ModelRef {
  std::string repo;     ///< ORG/REPO
  std::string pattern;  ///< FILE, or "" for the default selection (select_files)
  std::string text() const { return "hf:" + repo + (pattern.empty() ? "" : ":" + pattern); }
};

/// True when `model` names a hub model (starts with "hf:").
bool is_hub_ref(std::string_view model);

/// Parses `hf:ORG/REPO[:FILE]`. ORG and REPO are letters, digits, '-', '_'
/// and '.' (not "." or ".."), as the hub allows; an InputError names the
/// value and what is wrong.
ModelRef parse_ref(std::string_view model);

/// One file of a repository as the hub's tree API lists it.
struct RepoFile {
  std::string path;        ///< relative, '/'-separated
  std::uint64_t size = 0;  ///< bytes
  std::string sha256;      ///< lfs.oid for files in LFS (hex), else ""
  std::string git_oid;     ///< the git blob id (SHA-1 hex): what the hub lists for the others
};

/// What a reference selects in a listing, and what to load.
struct Selection {
  std::vector<RepoFile> files;  ///< to have in the cache, in path order
  /// The model to load, relative to the repository's cache folder: the
  /// GGUF file when every selected file is a GGUF (the first of a split),
  /// else "" (the folder: config.json, safetensors, tokenizer files).
  std::string model_file;
};

/// The files `ref` selects from `listing`:
/// - FILE given: the files whose path equals it or matches it as a glob
///   (fnmatch, '*' not crossing '/');
/// - none given: the repository's one GGUF file; among several, the one
///   named Q4_K_M (llama.cpp's default); else, when it has config.json, the
///   Hugging Face folder (every *.json, *.safetensors and tokenizer.model).
/// An InputError names the reference and lists the GGUF files to pick from
/// when nothing or too much matches.
Selection select_files(const ModelRef& ref, const std::vector<RepoFile>& listing);

/// Checks a path the hub listed before it becomes a file name under the
/// cache: relative, no empty, "." or ".." component, no NUL or backslash.
/// An InputError names the repository and the path.
void check_repo_path(const std::string& repo, const std::string& path);

}  // namespace ftp::hub
