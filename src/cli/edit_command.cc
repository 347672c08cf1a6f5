// `ubtrfs edit IMAGE [-f SCRIPT]`: the verbs of verbs.cc on paths inside one
// image, a line each, all in one transaction. A script is all or nothing:
// the first failing line stops it with its line number and the image is put
// back byte for byte (OpenOptions::undo_uncommitted, Filesystem::Discard).
// At a terminal it is a prompt with history; there a failing line is
// reported, changes nothing (undone as described at undo_line) and the
// session goes on, `commit` commits, `abort` gives up everything since the
// last commit, and the end of input commits.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <editline/readline.h>
#include <fmt/core.h>
#include <fmt/ranges.h>

#include "cli/commands.h"
#include "cli/image_options.h"
#include "cli/verbs.h"

namespace ubtrfs::cli {
namespace {

// Splits a line as a shell would, without expansions: whitespace separates
// words, '...' is literal, "..." keeps \" \\ \$ escapes, a backslash outside
// quotes escapes the next byte, and '#' at the start of a word begins a
// comment. False with *error set for an unterminated quote.
bool SplitWords(const std::string& line, std::vector<std::string>* words, std::string* error) {
  words->clear();
  std::string cur;
  bool in_word = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
      if (in_word) words->push_back(std::move(cur));
      cur.clear();
      in_word = false;
    } else if (c == '#' && !in_word) {
      break;
    } else if (c == '\'') {
      const size_t end = line.find('\'', i + 1);
      if (end == std::string::npos) {
        *error = "unterminated ' quote";
        return false;
      }
      cur += line.substr(i + 1, end - i - 1);
      i = end;
      in_word = true;
    } else if (c == '"') {
      size_t j = i + 1;
      for (; j < line.size() && line[j] != '"'; ++j) {
        if (line[j] == '\\' && j + 1 < line.size() && std::strchr("\"\\$`", line[j + 1])) ++j;
        cur.push_back(line[j]);
      }
      if (j >= line.size()) {
        *error = "unterminated \" quote";
        return false;
      }
      i = j;
      in_word = true;
    } else if (c == '\\' && i + 1 < line.size()) {
      cur.push_back(line[++i]);
      in_word = true;
    } else {
      cur.push_back(c);
      in_word = true;
    }
  }
  if (in_word) words->push_back(std::move(cur));
  return true;
}

// Runs one line; "" on success, else what failed. *writes: whether its verb
// changes the image.
std::string RunLine(Filesystem& fs, const std::vector<std::string>& words, bool* writes = nullptr) {
  VerbSession session;
  session.fs = &fs;
  CLI::App app{"edit"};
  app.require_subcommand(1);
  RegisterVerbs(app, &session);
  if (words[0] == "help") {
    std::string names;
    for (const auto* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      names += fmt::format("  {:<10} {}\n", sub->get_name(), sub->get_description());
    }
    fmt::print("Commands (COMMAND --help for its options), one per line; commit, abort, quit:\n{}", names);
    return "";
  }
  bool known = false;
  for (const auto* sub : app.get_subcommands([](CLI::App*) { return true; })) known |= sub->get_name() == words[0];
  if (!known) return words[0] + ": unknown command (help lists them)";
  std::vector<std::string> args(words.rbegin(), words.rend());  // CLI11 takes them last first
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return "";
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  if (writes) *writes = session.writes;  // the other returns ran no verb
  return session.status.ok() ? "" : session.status.message();
}

struct Reader {
  virtual ~Reader() = default;
  virtual bool Next(std::string* line) = 0;
};

struct StreamReader : Reader {
  explicit StreamReader(std::istream& in) : in_(in) {}
  bool Next(std::string* line) override { return static_cast<bool>(std::getline(in_, *line)); }
  std::istream& in_;
};

struct PromptReader : Reader {
  bool Next(std::string* line) override {
    char* l = readline("ubtrfs> ");
    if (l == nullptr) return false;
    *line = l;
    if (!line->empty()) add_history(l);
    std::free(l);
    return true;
  }
};

void CmdEdit(const std::string& image, const std::string& script) {
  std::ifstream file;
  std::unique_ptr<Reader> reader;
  const bool interactive = script.empty() && ::isatty(0);
  if (!script.empty() && script != "-") {
    file.open(script);
    if (!file) {
      fmt::print(stderr, "ubtrfs: edit: cannot open {}: {}\n", script, strerror(errno));
      return SetExitCode(2);
    }
    reader = std::make_unique<StreamReader>(file);
  } else if (interactive) {
    reader = std::make_unique<PromptReader>();
  } else {
    reader = std::make_unique<StreamReader>(std::cin);
  }
  OpenOptions o;
  o.writable = true;
  o.undo_uncommitted = true;
  o.max_dirty_bytes = UINT64_MAX;  // no commit of its own in the middle of a script
  PlacementInto(&o);
  SubvolOptionsInto(&o);
  auto fs = Filesystem::Open(image, o);
  if (!fs.ok()) {
    fmt::print(stderr, "ubtrfs: edit: {}: {}\n", image, fs.status().ToString());
    return SetExitCode(1);
  }
  // At a terminal a failing line changes nothing either: what it did is
  // undone by discarding everything since the last commit, reopening, and
  // doing again the lines that went well since (kept here).
  std::vector<std::vector<std::string>> since_commit;
  auto undo_line = [&]() -> bool {
    for (;;) {
      if (Status st = (*fs)->Discard(); !st.ok()) fmt::print(stderr, "ubtrfs: edit: {}\n", st.ToString());
      fs->reset();
      fs = Filesystem::Open(image, o);
      if (!fs.ok()) {
        fmt::print(stderr, "ubtrfs: edit: reopening {}: {}\n", image, fs.status().ToString());
        return false;
      }
      size_t i = 0;
      std::string e;
      while (i < since_commit.size() && (e = RunLine(**fs, since_commit[i])).empty()) ++i;
      if (i == since_commit.size()) return true;
      // The world changed under it (a host file of a copy-in): that line
      // and the ones after it are given up, the ones before it redone.
      fmt::print(stderr, "ubtrfs: edit: doing '{}' again failed ({}); it and the {} lines after it are undone\n",
                 fmt::join(since_commit[i], " "), e, since_commit.size() - i - 1);
      since_commit.resize(i);
    }
  };

  for (const auto& w : (*fs)->Warnings()) fmt::print(stderr, "ubtrfs: warning: {}: {}\n", image, w);
  const std::string where = script.empty() || script == "-" ? "stdin" : script;
  std::string line, error;
  std::vector<std::string> words;
  for (int n = 1; reader->Next(&line); ++n) {
    bool writes = false;
    if (!SplitWords(line, &words, &error)) {
      error = where + ":" + std::to_string(n) + ": " + error;
    } else if (words.empty()) {
      continue;
    } else if (words[0] == "commit" && words.size() == 1) {
      Status st = (*fs)->Commit();
      if (st.ok()) {
        since_commit.clear();
        continue;
      }
      error = where + ":" + std::to_string(n) + ": commit: " + st.ToString();
    } else if (words[0] == "abort" && words.size() == 1) {
      Status st = (*fs)->Discard();
      if (!st.ok()) fmt::print(stderr, "ubtrfs: edit: {}\n", st.ToString());
      fmt::print(stderr, "ubtrfs: edit: changes since the last commit discarded\n");
      return SetExitCode(interactive ? 0 : 1);
    } else if (words[0] == "quit" || words[0] == "exit") {
      break;
    } else if (std::string e = RunLine(**fs, words, &writes); !e.empty()) {
      error = where + ":" + std::to_string(n) + ": " + e;
    } else if (interactive && writes) {
      since_commit.push_back(words);
    }
    if (error.empty()) continue;
    fmt::print(stderr, "ubtrfs: edit: {}\n", error);
    if (interactive) {
      error.clear();
      if (writes && !undo_line()) return SetExitCode(1);
      continue;
    }
    Status st = (*fs)->Discard();
    if (!st.ok()) fmt::print(stderr, "ubtrfs: edit: {}\n", st.ToString());
    else fmt::print(stderr, "ubtrfs: edit: nothing was changed\n");
    return SetExitCode(1);
  }
  Status st = (*fs)->Commit();
  if (!st.ok()) {
    fmt::print(stderr, "ubtrfs: edit: commit: {}\n", st.ToString());
    (void)(*fs)->Discard();
    SetExitCode(1);
  }
}

}  // namespace

void RegisterEdit(CLI::App& app) {
  static std::string image, script;
  auto* edit = app.add_subcommand(
      "edit", "Apply editing commands (one per line: the verbs, mkdir, rm, rmdir, ls, cat, copy-in, copy-out, commit, abort) "
              "to an image in one transaction");
  edit->add_option("image", image, "Image file")->required();
  edit->add_option("-f,--file", script, "Script to run ('-' or none: standard input; a terminal gets a prompt)");
  edit->callback([] { CmdEdit(image, script); });
}

}  // namespace ubtrfs::cli
