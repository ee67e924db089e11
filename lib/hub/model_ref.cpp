// SPDX-License-Identifier: Apache-2.0
#include "hub/model_ref.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <cctype>

#include "core/error.hpp"

namespace ftp::hub {

namespace {

bool name_ok(std::string_view s) {
  if (s.empty() || s == "." || s == ".." || s.size() > 96) return false;
  return std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) != 0 || c == '-' || c == '_' || c == '.';
  });
}

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool is_gguf(const std::string& path) { return ends_with(lower(path), ".gguf"); }

/// The GGUF files of a listing, for error messages (at most 12 named).
std::string gguf_names(const std::vector<RepoFile>& listing) {
  std::string out;
  int n = 0, shown = 0;
  for (const auto& f : listing)
    if (is_gguf(f.path)) {
      ++n;
      if (shown < 12) out += (shown++ ? ", " : "") + f.path;
    }
  if (n == 0) return "it has no GGUF file";
  if (n > shown) out += ", and " + std::to_string(n - shown) + " more";
  return "its GGUF files: " + out;
}

bool folder_file(const std::string& path) {
  if (path.find('/') != std::string::npos) return false;  // the top level only
  return ends_with(path, ".json") || ends_with(path, ".safetensors") || path == "tokenizer.model";
}

}  // namespace

bool is_hub_ref(std::string_view model) { return model.substr(0, 3) == "hf:"; }

ModelRef parse_ref(std::string_view model) {
  const std::string text(model);
  auto bad = [&](const std::string& why) {
    return InputError("--model '" + text + "': " + why + " (expected hf:ORG/REPO[:FILE])");
  };
  if (!is_hub_ref(model)) throw bad("not a hub reference");
  std::string_view rest = model.substr(3);
  ModelRef r;
  const auto colon = rest.find(':');
  std::string_view repo = rest.substr(0, colon);
  if (colon != std::string_view::npos) {
    r.pattern = std::string(rest.substr(colon + 1));
    if (r.pattern.empty()) throw bad("empty FILE after ':'");
  }
  const auto slash = repo.find('/');
  if (slash == std::string_view::npos) throw bad("no '/' between ORG and REPO");
  if (!name_ok(repo.substr(0, slash))) throw bad("ORG '" + std::string(repo.substr(0, slash)) + "' is not a hub name");
  if (!name_ok(repo.substr(slash + 1)))
    throw bad("REPO '" + std::string(repo.substr(slash + 1)) + "' is not a hub name");
  r.repo = std::string(repo);
  return r;
}

void check_repo_path(const std::string& repo, const std::string& path) {
  auto bad = [&](const char* why) { return InputError("hf:" + repo + ": the hub lists the path '" + path + "', " + why); };
  if (path.empty() || path.front() == '/') throw bad("which is not relative");
  if (path.find('\\') != std::string::npos || path.find('\0') != std::string::npos)
    throw bad("which holds a backslash or NUL");
  std::size_t start = 0;
  while (start <= path.size()) {
    const std::size_t end = std::min(path.find('/', start), path.size());
    const std::string_view part(path.data() + start, end - start);
    if (part.empty() || part == "." || part == "..") throw bad("which has an empty, '.' or '..' component");
    start = end + 1;
  }
}

Selection select_files(const ModelRef& ref, const std::vector<RepoFile>& listing) {
  Selection s;
  if (!ref.pattern.empty()) {
    for (const auto& f : listing)
      if (f.path == ref.pattern || fnmatch(ref.pattern.c_str(), f.path.c_str(), FNM_PATHNAME) == 0) s.files.push_back(f);
    if (s.files.empty()) throw InputError(ref.text() + ": no file of the repository matches '" + ref.pattern + "'; " + gguf_names(listing));
  } else {
    std::vector<RepoFile> gguf;
    for (const auto& f : listing)
      if (is_gguf(f.path)) gguf.push_back(f);
    if (gguf.size() == 1) {
      s.files = gguf;
    } else {
      for (const auto& f : gguf)
        if (lower(f.path).find("q4_k_m") != std::string::npos) s.files.push_back(f);
      if (s.files.size() != 1) {
        s.files.clear();
        const bool hf_folder = std::any_of(listing.begin(), listing.end(), [](const RepoFile& f) { return f.path == "config.json"; });
        if (hf_folder && gguf.empty()) {
          for (const auto& f : listing)
            if (folder_file(f.path)) s.files.push_back(f);
        } else {
          throw InputError(ref.text() + ": name the file to serve, hf:" + ref.repo + ":FILE; " + gguf_names(listing));
        }
      }
    }
  }
  std::sort(s.files.begin(), s.files.end(), [](const RepoFile& a, const RepoFile& b) { return a.path < b.path; });
  const bool all_gguf = std::all_of(s.files.begin(), s.files.end(), [](const RepoFile& f) { return is_gguf(f.path); });
  if (all_gguf) s.model_file = s.files.front().path;
  return s;
}

}  // namespace ftp::hub
