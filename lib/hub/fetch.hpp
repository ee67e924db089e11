// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include "hub/model_ref.hpp"

namespace ftp::hub {

/// Where and how fetch() gets a model.
struct FetchOptions {
  std::string endpoint = "https://huggingface.co";  ///< HF_ENDPOINT
  std::string token;                                ///< HF_TOKEN
  std::filesystem::path cache_dir;                  ///< $XDG_CACHE_HOME/flextp, else ~/.cache/flextp
  bool offline = false;                             ///< HF_HUB_OFFLINE=1: never ask the network
  bool progress = false;                            ///< a bar on stderr (set when stderr is a terminal)
  std::function<void(std::string_view)> log;        ///< one line per step (listing, each file), or none
};

/// The options from the environment: HF_ENDPOINT, HF_TOKEN,
/// HF_HUB_OFFLINE (1, true, yes, on), XDG_CACHE_HOME or HOME; progress
/// when stderr is a terminal.
FetchOptions options_from_environment();

/// The local path of a hub model, downloading what the cache lacks.
///
/// The cache holds each repository under `<cache_dir>/hf/ORG/REPO/`: its
/// files at their repository paths, and `.flextp-listing.json`, the file
/// list (paths, sizes, digests) the hub gave when it was first fetched. A
/// selection whose files are all there with their listed sizes is used as
/// it is, with no network call at all (delete the folder to fetch anew).
/// Otherwise, unless offline, it asks the hub for the listing
/// (`GET {endpoint}/api/models/ORG/REPO/tree/main?recursive=true`, pages
/// followed), picks the files (select_files) and downloads each missing one
/// (`{endpoint}/ORG/REPO/resolve/main/PATH`) into PATH.part, resuming a
/// part left by an interrupted run, then checks it against the digest the
/// hub listed (the sha256 of LFS files, the git blob id of the others)
/// before renaming it into place. A mismatch removes the part and is an
/// Error naming the file and both digests. Offline with files missing is
/// an Error naming the first missing file. One process at a time per
/// repository (a lock file beside the listing).
///
/// Returns the GGUF file, or the repository's folder for a Hugging Face
/// folder (Selection::model_file).
std::filesystem::path fetch(const ModelRef& ref, const FetchOptions& options);

/// The hub's tree listing (a JSON array) as files; an InputError names
/// the repository and the entry at fault. Directories are skipped.
std::vector<RepoFile> parse_listing(const std::string& repo, std::string_view json_text);

}  // namespace ftp::hub
