#include "support/deadline.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <sstream>
#include <thread>

#include <fmt/core.h>

#include "support/host_files.h"

extern char** environ;

namespace ubtrfs_test {
namespace {

// /proc/PID/cmdline with its NULs as spaces ("" once the process is gone).
std::string CommandLine(long pid) {
  std::string cmd = ReadHostFile(fmt::format("/proc/{}/cmdline", pid));
  for (char& c : cmd) c = c == '\0' ? ' ' : c;
  return cmd;
}

// Pids whose /proc/PID/cmdline contains one of `watch`, this process left out.
std::vector<pid_t> Watched(const std::vector<std::string>& watch) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0' || pid == getpid()) continue;
    const std::string cmd = CommandLine(pid);
    for (const std::string& w : watch) {
      if (cmd.find(w) != std::string::npos) {
        out.push_back(static_cast<pid_t>(pid));
        break;
      }
    }
  }
  closedir(d);
  return out;
}

}  // namespace

std::string StuckReport(const std::vector<std::string>& watch) {
  std::string r;
  const bool gdb = !FindProgram("gdb").empty();
  for (pid_t pid : Watched(watch)) {
    r += fmt::format("--- pid {}: {}\n", pid, CommandLine(pid));
    const std::string tasks = fmt::format("/proc/{}/task", pid);
    if (DIR* d = opendir(tasks.c_str())) {
      while (dirent* e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        const std::string t = tasks + "/" + e->d_name;
        std::string comm = ReadHostFile(t + "/comm");
        if (!comm.empty() && comm.back() == '\n') comm.pop_back();
        std::string state;
        std::istringstream st(ReadHostFile(t + "/status"));
        for (std::string line; std::getline(st, line);) {
          if (line.rfind("State:", 0) == 0) state = line.substr(6);
        }
        r += fmt::format("  thread {} {} state{} wchan {}\n", e->d_name, comm, state, ReadHostFile(t + "/wchan"));
      }
      closedir(d);
    }
    if (gdb) {
      CommandResult bt = RunCommand({"gdb", "-p", std::to_string(pid), "-batch", "-nx", "-ex", "thread apply all bt 30"});
      r += bt.out.size() > 60000 ? bt.out.substr(0, 60000) + "\n[...]\n" : bt.out;
    }
  }
  if (!gdb) r += "(gdb is not installed: no user-space backtraces)\n";
  return r;
}

CommandResult RunCommandWithDeadline(const std::vector<std::string>& argv, const std::string& log_path, int seconds,
                                     const std::vector<std::string>& watch, std::string* overdue) {
  CommandResult res;
  const std::string prog = argv.empty() ? "" : FindProgram(argv[0]);
  if (prog.empty()) {
    res.err = "program not found: " + (argv.empty() ? std::string("(none)") : argv[0]);
    return res;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  const int rc = posix_spawn(&pid, prog.c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    res.err = fmt::format("spawn {}: {}", prog, strerror(rc));
    return res;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  int status = 0;
  for (;;) {
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) {
      res.err = fmt::format("waitpid: {}", strerror(errno));
      return res;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      *overdue = StuckReport(watch);
      for (pid_t p : Watched(watch)) kill(p, SIGKILL);
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      res.exit_code = -2;
      res.out = ReadHostFile(log_path);
      return res;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (WIFEXITED(status)) res.exit_code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) res.exit_code = 128 + WTERMSIG(status);
  res.out = ReadHostFile(log_path);
  return res;
}

}  // namespace ubtrfs_test
