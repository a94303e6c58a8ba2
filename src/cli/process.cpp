#include "cli/process.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <array>
#include <csignal>

namespace ctquant::cli {

namespace {

std::atomic<bool> g_cancel{false};
std::atomic<int> g_signal{0};
std::atomic<bool> g_exit_at_once{false};

constexpr std::array<int, 3> kSignals = {SIGINT, SIGTERM, SIGHUP};

// The message of each signal of kSignals, made before the handler may read
// it (on_signal_exit_at_once stores g_exit_at_once after writing them).
std::array<std::string, kSignals.size()> g_messages;

extern "C" void on_signal(int signal_number) {
  g_signal.store(signal_number);
  g_cancel.store(true);
  if (!g_exit_at_once.load()) return;
  // Only async-signal-safe calls: write(2) and _exit(2).
  for (std::size_t i = 0; i < kSignals.size(); ++i) {
    if (kSignals[i] != signal_number) continue;
    const std::string& message = g_messages[i];
    const ssize_t written = ::write(STDERR_FILENO, message.data(), message.size());
    static_cast<void>(written);  // nothing more can be done about stderr here
  }
  ::_exit(1);
}

}  // namespace

void install_signal_handlers() {
  struct sigaction action {};
  action.sa_handler = on_signal;
  action.sa_flags = SA_RESETHAND | SA_RESTART;
  sigemptyset(&action.sa_mask);
  for (const int signal_number : kSignals) {
    // A signal the parent ignores stays ignored (nohup, `cmd &` in a script).
    struct sigaction previous {};
    if (sigaction(signal_number, nullptr, &previous) == 0 && previous.sa_handler == SIG_IGN) {
      continue;
    }
    sigaction(signal_number, &action, nullptr);
  }
  // A file size limit (RLIMIT_FSIZE) must surface as EFBIG, a clean "no
  // space" error, not as a signal that kills the process mid-write; a closed
  // stderr pipe must not kill it before it has cleaned up either.
  std::signal(SIGXFSZ, SIG_IGN);
  std::signal(SIGPIPE, SIG_IGN);
}

const std::atomic<bool>* cancel_flag() { return &g_cancel; }

int caught_signal() { return g_signal.load(); }

const char* signal_name(int signal_number) {
  switch (signal_number) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "a signal";
  }
}

void on_signal_exit_at_once(const std::string& what, const std::string& after) {
  g_exit_at_once.store(false);
  const std::string erase = ::isatty(STDERR_FILENO) == 1 ? "\r\033[K" : "";
  for (std::size_t i = 0; i < kSignals.size(); ++i) {
    g_messages[i] =
        erase + "ctquant: error: " + what + " (" + signal_name(kSignals[i]) + ")" + after + "\n";
  }
  g_exit_at_once.store(true);
  // A signal that came before (while the options were parsed) ends it now.
  if (g_cancel.load()) on_signal(g_signal.load());
}

void on_signal_cancel() { g_exit_at_once.store(false); }

void raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  limit.rlim_cur = limit.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &limit);  // best effort: the pools adapt to what is in force
}

}  // namespace ctquant::cli
