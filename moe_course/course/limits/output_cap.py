"""A cap on what a grading kernel may send back, and on how long it may keep silent: nbgrader's cell executor,
counting every output's bytes and ending a kernel that stops answering.

It runs in the grading worker, outside the sandbox, so nothing a submission does can lift it. A notebook
whose outputs (printed text, displays, results, errors) and widget (comm) messages pass ``Limits.output_bytes``
is stopped there:
``OutputLimitError`` ends that submission's grading with status "failed" and that reason, and its kernel is
shut down by nbclient as for any other failure.

What the kernel sends where nobody reads cannot pile up here either: the client's stdin channel (the kernel's
``input_request`` route; grading allows no input) and control channel are never connected while the kernel
runs, so whatever is sent on them is dropped by the kernel's own socket (a ROUTER drops what it cannot route)
instead of queueing, unread, in this process. The one control socket this process does hold, the kernel
manager's (``BoundedKernelManager``: it sends the interrupts and the shutdown request, and never reads), takes
no message over ``CONTROL_MESSAGE_BYTES`` -- ZeroMQ's ``MAXMSGSIZE`` drops the connection of a peer that sends
one -- and queues at most ``CONTROL_QUEUE``. (A kernel that sent 60 ``debug_reply`` messages of 48 MiB to the
manager's socket from its control thread held 3.0 GiB in the grading worker before.) The client's shell and
iopub channels are read as the kernel sends, every message dropped once handled and iopub's counted against the
output cap: there a message over a size limit would be lost unread and its cell would wait out the iopub
timeout instead of stopping at the cap with its reason.

A cell past its timeout is interrupted (nbclient) and scores 0; its kernel must then deliver that cell's reply
within ``answer_seconds``. One that does not -- it swallows the interrupt, or drops its replies -- ends the
submission's grading there with ``ReplyTimeoutError``, instead of making every later cell wait out its own
timeout.
"""

from __future__ import annotations

import json
from queue import Empty
from time import monotonic

import zmq
import zmq.asyncio
from jupyter_client.manager import AsyncKernelManager
from nbclient.util import ensure_async, run_hook, run_sync
from nbgrader.preprocessors import Execute
from traitlets import Integer

# What a kernel sends back: outputs, and the comm (widget) messages nbclient keeps in the notebook's metadata.
COUNTED = ("stream", "display_data", "update_display_data", "execute_result", "error", "comm_open", "comm_msg",
           "comm_close", "clear_output")
CONTROL_MESSAGE_BYTES = 2**20  # a control reply (to an interrupt or shutdown request) is a few hundred bytes
CONTROL_QUEUE = 4  # messages the manager's control socket queues, unread


def bounded_context(max_message_bytes: int, queued: int | None = None) -> zmq.asyncio.Context:
    """A ZeroMQ context whose sockets take no message part over ``max_message_bytes`` (``MAXMSGSIZE``: the
    connection of a peer that sends one is dropped) and queue at most ``queued`` received messages
    (``RCVHWM``; ZeroMQ's default of 1000 when None)."""
    context = zmq.asyncio.Context()
    context.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    if queued is not None:
        context.setsockopt(zmq.RCVHWM, queued)
    return context


class BoundedKernelManager(AsyncKernelManager):
    """jupyter_client's kernel manager whose own control socket (the only socket it makes) is bounded: at most
    ``CONTROL_QUEUE`` messages of at most ``CONTROL_MESSAGE_BYTES`` each (``bounded_context``)."""

    def _context_default(self) -> zmq.asyncio.Context:
        self._created_context = True
        return bounded_context(CONTROL_MESSAGE_BYTES, CONTROL_QUEUE)


class OutputLimitError(RuntimeError):
    """The submission's outputs passed the cap (message: how many bytes it allows)."""


class ReplyTimeoutError(RuntimeError):
    """A kernel sent no reply for a cell it was told to interrupt (message: the seconds it was given)."""


class CappedExecute(Execute):
    """nbgrader's ``Execute`` that counts the bytes of every output and comm message and raises
    ``OutputLimitError`` once their sum passes ``output_bytes``, and raises ``ReplyTimeoutError`` when a cell
    interrupted at its timeout gets no reply within ``answer_seconds``."""

    output_bytes = Integer(16 * 2**20, help="bytes of output a whole notebook may send").tag(config=True)
    answer_seconds = Integer(10, help="seconds an interrupted cell's kernel has to reply").tag(config=True)

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("kernel_manager_class", BoundedKernelManager)
        super().__init__(*args, **kwargs)

    def preprocess(self, nb, resources=None, km=None):
        """Execute notebook ``nb`` as nbgrader's ``Execute`` does, counting its output from zero."""
        self._sent = 0
        return super().preprocess(nb, resources, km)

    def process_message(self, msg, cell, cell_index):
        """nbclient's handling of one kernel message, after adding its size (bytes of its JSON content, binary
        buffers included) to the notebook's total; raises ``OutputLimitError`` past ``output_bytes``."""
        if msg.get("msg_type") in COUNTED:
            self._sent += len(json.dumps(msg.get("content", {}), ensure_ascii=False, default=str))
            self._sent += sum(memoryview(buffer).nbytes for buffer in msg.get("buffers") or ())
            if self._sent > self.output_bytes:
                raise OutputLimitError(f"the notebook's output passed the limit of {self.output_bytes} bytes "
                                       f"(--max-output-mb); grading stopped at cell {cell_index}")
        return super().process_message(msg, cell, cell_index)

    async def _async_poll_for_reply(self, msg_id, cell, timeout, task_poll_output_msg, task_poll_kernel_alive):
        """nbclient's wait for the reply to execute request ``msg_id``, which is remembered for
        ``_async_handle_timeout``."""
        self._awaited = msg_id
        return await super()._async_poll_for_reply(msg_id, cell, timeout, task_poll_output_msg,
                                                   task_poll_kernel_alive)

    async def _async_handle_timeout(self, timeout, cell=None):
        """nbclient's interrupt of a cell past its ``timeout`` (s); then the kernel's reply to that cell is read
        from the shell channel, which raises ``ReplyTimeoutError`` if none comes within ``answer_seconds``."""
        reply = await super()._async_handle_timeout(timeout, cell)
        deadline = monotonic() + self.answer_seconds
        while (left := deadline - monotonic()) > 0:
            try:
                msg = await ensure_async(self.kc.shell_channel.get_msg(timeout=left))
            except Empty:
                break
            if msg.get("parent_header", {}).get("msg_id") == self._awaited:
                return reply
        raise ReplyTimeoutError(f"the kernel sent no reply within {self.answer_seconds} s of interrupting a cell "
                                f"at its {timeout} s timeout (--cell-timeout); grading stopped there")

    async def async_start_new_kernel_client(self):
        """nbclient's kernel client for the started kernel (``self.kc``), with its shell, iopub and heartbeat
        channels and no stdin or control channel (see the module docstring; jupyter_client connects those only
        when ``stop_channels`` looks at them, after the kernel was shut down). A kernel that does not answer
        within ``startup_timeout`` is cleaned up and the error raised, as nbclient does."""
        self.kc = self.km.client()
        try:
            await ensure_async(self.kc.start_channels(stdin=False, control=False))
            await ensure_async(self.kc.wait_for_ready(timeout=self.startup_timeout))
        except Exception:
            await self._async_cleanup_kernel()
            raise
        self.kc.allow_stdin = False
        await run_hook(self.on_notebook_start, notebook=self.nb)
        return self.kc

    start_new_kernel_client = run_sync(async_start_new_kernel_client)
