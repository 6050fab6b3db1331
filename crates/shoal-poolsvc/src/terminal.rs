//! The home's terminal: raw while a remote program has a pty, given
//! back as it was found.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};

use shoal_pool::exec::WinSize;

/// The home's terminal (standard input) and the mode it was found in.
pub(crate) struct Terminal {
    saved: libc::termios,
    raw: AtomicBool,
}

impl Terminal {
    /// Puts standard input's terminal in raw mode, if it is one: every
    /// key, Ctrl-C and Ctrl-Z too, goes to the program's pty.
    pub(crate) fn raw() -> Option<Terminal> {
        if !std::io::stdin().is_terminal() {
            return None;
        }
        // SAFETY: tcgetattr fills `saved`.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        if unsafe { libc::tcgetattr(0, &mut saved) } != 0 {
            return None;
        }
        let t = Terminal {
            saved,
            raw: AtomicBool::new(false),
        };
        t.make_raw();
        Some(t)
    }

    pub(crate) fn make_raw(&self) {
        let mut raw = self.saved;
        // SAFETY: cfmakeraw edits a local copy; tcsetattr on stdin.
        unsafe {
            libc::cfmakeraw(&mut raw);
            libc::tcsetattr(0, libc::TCSADRAIN, &raw);
        }
        self.raw.store(true, Ordering::Release);
    }

    pub(crate) fn restore(&self) {
        if self.raw.swap(false, Ordering::AcqRel) {
            // SAFETY: tcsetattr on stdin with the mode found.
            unsafe { libc::tcsetattr(0, libc::TCSADRAIN, &self.saved) };
        }
    }

    /// Standard input's terminal size, if it is a terminal.
    pub(crate) fn size() -> Option<WinSize> {
        // SAFETY: TIOCGWINSZ fills `ws`.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        if unsafe { libc::ioctl(0, libc::TIOCGWINSZ, &mut ws) } != 0 || ws.ws_row == 0 {
            return None;
        }
        Some(WinSize {
            rows: ws.ws_row,
            cols: ws.ws_col,
        })
    }
}
