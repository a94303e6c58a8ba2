// The process side of the CLI: signals and resource limits (private to
// src/cli).
//
// SIGINT, SIGTERM and SIGHUP ask a command to stop. While a command has
// written nothing that needs cleaning up (inspect and verify always; quantize
// until it creates its temporary OUTPUT directory or its staging directory,
// QuantizeOptions::before_writing), the handler ends the process at once:
// it writes the message given to on_signal_exit_at_once() and exits with
// status 1, whatever the command is doing (reading headers, planning,
// linting, comparing tensors on several threads). Once the command writes,
// the handler only sets the cancel flag, which the library polls between
// jobs, phases and files, and the command removes what it wrote and ends
// with Error{kInterrupted}, exit status 1 too. SA_RESETHAND: a second
// signal ends the process at once (a temporary directory may then be left,
// recognisable by its name).
#pragma once

#include <atomic>
#include <string>

namespace ctquant::cli {

// Installs the handlers of SIGINT, SIGTERM and SIGHUP (a signal the parent
// ignores stays ignored: nohup, `cmd &` in a script), and ignores SIGXFSZ
// (a file size limit is a clean "no space" error) and SIGPIPE.
void install_signal_handlers();

// The flag the handler sets, for QuantizeOptions::cancel and the like.
const std::atomic<bool>* cancel_flag();

// The signal that set the flag (0: none yet).
int caught_signal();

// "SIGINT", "SIGTERM", "SIGHUP", or "a signal".
const char* signal_name(int signal_number);

// From now on a signal ends the process at once with exit status 1, after
// writing to stderr "ctquant: error: <what> (SIGxxx)<after>\n" (preceded by
// an erase of the progress line when stderr is a terminal). Call it before
// a command starts; the text is made here, the handler only writes it.
void on_signal_exit_at_once(const std::string& what, const std::string& after);

// From now on a signal only sets the cancel flag: the command has started
// writing and must clean up before it ends.
void on_signal_cancel();

// Raises the soft limit on open files to the hard limit. ctquant keeps a
// bounded number of shards open (FdPool), sized from this limit: the common
// soft limit of 1024 would otherwise make a checkpoint of thousands of shards
// reopen files more often than it needs to.
void raise_open_file_limit();

}  // namespace ctquant::cli
