"""A child process's output lines, read on a thread of their own, so that waiting for one
has a deadline: a hung child fails a check instead of hanging the GPU suite (shared by
scripts/pausebench.py and scripts/torch_expandable_check.py)."""
import queue
import threading

NO_ANSWER = "(no answer in time)"
ENDED = "(the process ended)"


class Lines:
    """The lines of `stream` (text mode), stripped; `next()` waits at most `timeout`
    seconds and returns NO_ANSWER then, or ENDED once the stream is closed."""

    def __init__(self, stream, timeout=300):
        self.timeout = timeout
        self.queue = queue.Queue()

        def pump():
            for line in stream:
                self.queue.put(line.strip())
            self.queue.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def next(self, timeout=None):
        try:
            line = self.queue.get(timeout=self.timeout if timeout is None else timeout)
        except queue.Empty:
            return NO_ANSWER
        return ENDED if line is None else line
