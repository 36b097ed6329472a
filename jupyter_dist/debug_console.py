"""`jupyter distrun debug JOB` and `%distrun debug`: the paused ranks of a running job, from
a terminal or a notebook's input box.

Every request goes to the job's owner through the store (run/requests.request_debug: no
port is opened); the owner reaches each rank's pdb on its node (diagnose/debug.py).

- Scriptable: `--list` (`--json`), `--do CMD` with `--rank R` (pdb's answer as it is) or
  `--ranks SET` (each answer's lines prefixed with its rank), `--interrupt --rank R`.
- A console, with none of those: `list`, `attach R` (a plain pdb prompt for rank R;
  `detach` goes back), `cast RANKS CMD`, `continue` (every paused rank), `quit`. It reads
  with `input()`, so in a kernel its prompt is the notebook's input box, as IPython's `%debug`
  does; `--rank R` opens it attached to R. Ctrl-C (an interrupted kernel) and end of input
  leave it and the ranks as they are.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, TextIO

from jupyter_dist.describe import visible
from jupyter_dist.diagnose.debug import PausedRank, check_command, rank_not_paused
from jupyter_dist.errors import DistrunError
from jupyter_dist.events import state_words
from jupyter_dist.rank_sets import parse_rank_set
from jupyter_dist.run.requests import request_debug
from jupyter_dist.store import JobRecord

EXIT_OK, EXIT_FAILED = 0, 1
POST_MORTEM_WAIT_S = 300.0  # a warm session's post-mortem with nobody attached, at most
OWNER_SLACK_S = 15.0  # beyond a command's own timeout: the owner's turn to read the request

CONSOLE_HELP = """\
list              the paused ranks, one line each
attach R          a pdb prompt for rank R: each line goes to its pdb; `detach` comes back
cast RANKS CMD    one pdb command to a set of ranks (3, 0,2-3 or all), each answer
                  prefixed by its rank
continue          let every paused rank run on (pdb's `c`)
quit              leave; paused ranks stay paused (Ctrl-C and end of input leave too)"""


class OwnerLink:
    """The debugger's requests to a running job's owner, each waiting `timeout` for pdb."""

    def __init__(self, record: JobRecord, timeout: float = 30.0) -> None:
        self.record, self.timeout = record, timeout

    def _ask(self, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        wait = self.timeout if timeout is None else timeout
        return request_debug(self.record, request, wait + OWNER_SLACK_S)

    def paused(self) -> tuple[list[PausedRank], list[str]]:
        """The paused ranks, by rank; and one line per node that could not be asked."""
        answer = self._ask({"action": "list"})
        found = [PausedRank.from_dict(p) for p in answer.get("paused", [])]
        return found, [str(problem) for problem in answer.get("problems", [])]

    def send(self, rank: int, command: str, pid: int | None = None) -> dict[str, Any]:
        """{"answer": pdb's text, "paused": still paused after it, "state"}; to the rank's
        paused process `pid` where it has several."""
        return self._ask(
            {
                "action": "send",
                "rank": rank,
                "command": check_command(command),
                "timeout": self.timeout,
                "pid": pid,
            }
        )

    def cast(self, ranks: list[int] | None, command: str) -> list[dict[str, Any]]:
        """`command` to each of `ranks` (None: every paused one) at once: by rank, each
        {"rank", "answer", "paused"} or {"rank", "error"}."""
        answer = self._ask(
            {
                "action": "cast",
                "ranks": ranks,
                "command": check_command(command),
                "timeout": self.timeout,
            }
        )
        return list(answer.get("answers", []))

    def interrupt(self, rank: int, timeout: float) -> PausedRank | None:
        """Pause `rank` where it runs: where it paused, or None (signalled, in native code)."""
        answer = self._ask({"action": "interrupt", "rank": rank, "timeout": timeout}, timeout)
        return PausedRank.from_dict(answer["paused"]) if answer.get("paused") else None


LISTED_KEYS = ("rank", "node", "file", "line", "function", "reason", "exception")


def listed(paused: PausedRank) -> dict[str, Any]:
    """A paused rank as `--list --json` and the REST API give it."""
    return {key: getattr(paused, key) for key in LISTED_KEYS}


def cast_text(answers: list[dict[str, Any]], timeout: float = 30.0) -> str:
    """Answers of a cast, each line prefixed by its rank: `[rank 2] 42`; a rank that ran on
    after the command, or could not be asked, says so on a line of its own."""
    lines = []
    ranks = [found["rank"] for found in answers]
    for found in answers:
        several = ranks.count(found["rank"]) > 1 and found.get("pid") is not None
        tag = f"[rank {found['rank']} pid {found['pid']}]" if several else f"[rank {found['rank']}]"
        if found.get("error"):
            lines.append(f"{tag} error: {found['error']}")
            continue
        lines += [f"{tag} {line}" for line in str(found.get("answer", "")).splitlines()]
        said = after_command(found["rank"], found, timeout)
        if said:
            lines.append(f"{tag} {said.split(' ', 2)[2]}")  # "rank 2 runs on": "runs on"
    return "".join(visible(line) + "\n" for line in lines)


class DebugConsole:
    """The console over one job's paused ranks (the module's docstring says what it takes).
    Reads lines with `input()`, writes to `out`; an error is one line and the console
    goes on, until the job is no longer running."""

    def __init__(
        self, link: OwnerLink, job_id: str, out: TextIO | None = None, on_leaving: str = ""
    ) -> None:
        self.link, self.job_id = link, job_id
        self.out = out or sys.stdout
        # What Ctrl-C's line says becomes of the ranks.
        self.on_leaving = on_leaving or (
            f"every paused rank stays paused (come back: jupyter distrun debug {job_id})"
        )
        self.attached: int | None = None
        self._last_pdb_command = ""

    def say(self, text: str) -> None:
        self.out.write(text if text.endswith("\n") else text + "\n")
        self.out.flush()

    def run(self, attach: int | None = None, where: PausedRank | None = None) -> int:
        """Until `quit`, end of input, Ctrl-C or the job's end; attached to rank `attach`
        first (paused at `where`, where the caller has just listed it)."""
        found = where
        if found is None and attach is not None:
            found = self._paused(attach)  # not paused: one line, no console
        self.say(f"debugger console for job {self.job_id} (help: the commands; quit leaves)")
        try:
            if found is None:
                self.do_list()
            else:
                self._attach(found)
            while True:
                prompt = (
                    f"(Pdb rank {self.attached}) "
                    if self.attached is not None
                    else "(distrun debug) "
                )
                try:
                    line = _read(prompt)
                except EOFError:
                    if self.attached is None:
                        return EXIT_OK
                    self._detach("detached")
                    continue
                if not self.one_line(line):
                    return EXIT_OK
        except KeyboardInterrupt:
            self.say(f"\nleft the debugger console; {self.on_leaving}")
            return EXIT_OK
        except _NoInput:
            self.say(
                "this front end cannot ask for input: send commands with --do CMD and "
                "--rank R or --ranks SET"
            )
            return EXIT_OK
        except _JobOver as over:
            self.say(str(over))
            return EXIT_OK

    def one_line(self, line: str) -> bool:
        """Carry out one line; False once the console should end."""
        try:
            if self.attached is not None:
                self._pdb_line(line)
                return True
            word, _, rest = line.strip().partition(" ")
            if not word:
                return True
            if word in ("quit", "exit", "q"):
                return False
            handler = getattr(self, f"do_{word}", None)
            if handler is None:
                self.say(
                    f"unknown command {word!r}: list, attach R, cast RANKS CMD, continue, "
                    "quit (help: what each does)"
                )
                return True
            handler(rest.strip())
        except DistrunError as exc:
            self.say(f"error: {exc}")
            self._end_unless_running()
        return True

    def do_help(self, _rest: str = "") -> None:
        self.say(CONSOLE_HELP)

    def do_list(self, _rest: str = "") -> None:
        paused, problems = self.link.paused()
        for problem in problems:
            self.say(f"warning: {visible(problem)}")
        if not paused:
            self.say(f"no rank of job {self.job_id} is paused")
        for found in paused:
            self.say(visible(found.line_text()))

    def do_attach(self, rest: str) -> None:
        try:
            rank = int(rest)
        except ValueError:
            raise DistrunError(f"attach takes one rank number, not {rest!r}") from None
        self._attach(self._paused(rank))

    def _paused(self, rank: int) -> PausedRank:
        """Where rank `rank` is paused; DistrunError in one line where it is not."""
        paused, _ = self.link.paused()
        found = next((p for p in paused if p.rank == rank), None)
        if found is None:
            raise rank_not_paused(self.job_id, rank, paused)
        return found

    def _attach(self, found: PausedRank) -> None:
        self.attached, self._last_pdb_command = found.rank, ""
        self.say(f"attached to {visible(found.line_text())}; `detach` comes back")

    def do_cast(self, rest: str) -> None:
        words, _, command = rest.partition(" ")
        if not words or not command.strip():
            raise DistrunError("cast takes ranks and a pdb command: cast 0,2-3 p x")
        ranks = parse_rank_set(words, "cast")
        self.out.write(cast_text(self.link.cast(ranks, command)))
        self.out.flush()

    def do_continue(self, _rest: str = "") -> None:
        self.out.write(cast_text(self.link.cast(None, "c")))
        self.out.flush()

    def _pdb_line(self, line: str) -> None:
        """A line at rank `attached`'s prompt: `detach`, or pdb's (empty: its last again)."""
        assert self.attached is not None
        if line.strip() == "detach":
            self._detach("detached")
            return
        command = line.strip() or self._last_pdb_command
        if not command:
            return
        self._last_pdb_command = command
        try:
            answer = self.link.send(self.attached, command)
        except DistrunError as exc:
            self.say(f"error: {exc}")
            self._detach("detached")
            self._end_unless_running()
            return
        self.out.write(visible(answer["answer"]))
        self.out.flush()
        said = after_command(self.attached, answer, self.link.timeout)
        if said:
            self._detach(said)

    def _detach(self, why: str) -> None:
        rank, self.attached = self.attached, None
        self.say(why if why.startswith(f"rank {rank} ") else f"{why} from rank {rank}")

    def _end_unless_running(self) -> None:
        state = self.link.record.status().get("state")
        if state != "running":
            raise _JobOver(f"job {self.job_id} {state_words(state)}: the console ends")


class _JobOver(Exception):
    """The job is no longer running: nothing is left to debug."""


class _NoInput(Exception):
    """The front end has no way to ask for a line (a kernel run with stdin off)."""


def _read(prompt: str) -> str:
    """A line typed at `prompt` (a kernel's input box, in a notebook). EOFError at the end
    of input; _NoInput where nothing can be typed."""
    try:
        return input(prompt)
    except NotImplementedError:  # IPython's StdinNotImplementedError
        raise _NoInput from None


def debug_session(session: Any, args: argparse.Namespace) -> int:
    """`%distrun debug [--rank R] [--do CMD | --list]` in a kernel whose warm session is
    open (run/session.py): as `cmd_debug`, and where rank R's last cell failed and R is not
    paused, a post-mortem on that cell's error first, with its variables: the console, or
    with `--do` the command's answer (then the post-mortem ends, unless the command left
    it). `--list` names the failed ranks too, as post-mortems to be had. Leaving ends the
    post-mortem: the session lives on."""
    link = OwnerLink(session.job.record, args.timeout)
    rank, failed = args.rank, list(session.failed_ranks)
    if args.list or (args.json and args.do is None):
        return _list(link, args, session.job.record, failed=failed)
    if args.do is None and (args.interrupt or args.ranks is not None):
        return cmd_debug(args, session.job.record)

    def paused_at() -> PausedRank | None:
        return next((p for p in link.paused()[0] if p.rank == rank), None)

    where = None if rank is None or args.interrupt or args.ranks is not None else paused_at()
    if rank is None or rank not in failed or where is not None or args.ranks is not None:
        if args.do is not None or args.interrupt:
            return cmd_debug(args, session.job.record)
        if rank is None and failed:
            print(
                f"the last cell failed on rank {', '.join(map(str, failed))}: "
                f"`%distrun debug --rank {failed[0]}` looks where it raised"
            )
        return DebugConsole(link, session.job.job_id).run(attach=rank, where=where)
    if args.do is not None:
        check_command(args.do)  # before a post-mortem is started for nothing
    with _post_mortem(session, link, rank, args.timeout) as where:
        if args.do is not None:
            return _answer(link, rank, args.do)
        leaving = f"rank {rank}'s post-mortem ends; session {session.name} goes on"
        console = DebugConsole(link, session.job.job_id, on_leaving=leaving)
        return console.run(attach=rank, where=where)


@contextlib.contextmanager
def _post_mortem(session: Any, link: OwnerLink, rank: int, timeout: float):
    """Rank `rank` paused on its last cell's error, while the block runs (the PausedRank);
    on leaving, its post-mortem ends (`q`, where the block did not end it)."""
    outcome: dict[str, Any] = {}

    def look() -> None:
        try:
            outcome["debugged"] = session.post_mortem(rank, POST_MORTEM_WAIT_S)
        except BaseException as exc:  # said in this thread, below
            outcome["error"] = exc

    looking = threading.Thread(target=look, name="distrun-post-mortem", daemon=True)
    looking.start()
    try:
        deadline = time.monotonic() + timeout
        while looking.is_alive() and time.monotonic() < deadline:
            where = next((p for p in link.paused()[0] if p.rank == rank), None)
            if where is not None:
                yield where
                return
            time.sleep(0.05)
        if "error" in outcome:
            raise outcome["error"]
        if looking.is_alive():
            raise DistrunError(f"rank {rank} did not pause within {timeout:g} s")
        raise DistrunError(f"rank {rank}'s last cell did not fail: nothing to look into")
    finally:
        if looking.is_alive():  # the console is left: so is the post-mortem
            with contextlib.suppress(DistrunError):
                link.send(rank, "q")
            looking.join(timeout)


def cmd_debug(args: argparse.Namespace, record: JobRecord) -> int:
    """`jupyter distrun debug` (and `%distrun debug`) with its parsed arguments."""
    link = OwnerLink(record, args.timeout)
    if args.ranks is not None and args.rank is not None:
        raise DistrunError("give --rank R or --ranks SET, not both")
    if args.pid is not None and (args.rank is None or args.do is None or args.interrupt):
        raise DistrunError("--pid goes with --rank R and --do: which of its paused processes")
    if args.interrupt:
        if args.rank is None or args.list or args.json or args.ranks:
            raise DistrunError(
                "--interrupt pauses one rank: give --rank R (and --do CMD to run a command "
                "there), and nothing else"
            )
        if args.do is not None:
            check_command(args.do)  # before the rank is paused for nothing
        paused = link.interrupt(args.rank, min(args.timeout, 5.0))
        if args.do is not None:  # then the command, in the same call; it stays paused
            if paused is None and not _paused_within(link, args.rank, args.timeout):
                raise DistrunError(
                    f"rank {args.rank} did not pause within {args.timeout:g} s (it is in "
                    "native code: a collective, a lock?); nothing was sent"
                )
            return _answer(link, args.rank, args.do)
        if paused is not None:
            already = f"rank {args.rank} was paused already: " if paused.already else ""
            print(already + visible(paused.line_text()))
        else:
            print(
                f"rank {args.rank} was asked to pause; it will once its main thread runs "
                "Python again (it is in native code now: a collective, a lock?); "
                f"`jupyter distrun debug {record.job_id} --list` lists it then",
                file=sys.stderr,
            )
        return EXIT_OK
    if args.do is not None:
        return _do(link, args, record)
    if args.ranks is not None:
        raise DistrunError("--ranks goes with --do: --do 'p x' --ranks 0,2-3")
    if args.list or args.json:
        return _list(link, args, record)
    if sys.stdin.isatty():  # a terminal's line editing and history at the prompt
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401
    return DebugConsole(link, record.job_id).run(attach=args.rank)


def _do(link: OwnerLink, args: argparse.Namespace, record: JobRecord) -> int:
    """--do: one command to --rank R (pdb's answer as it is) or to --ranks SET."""
    if args.list:
        raise DistrunError("--do sends a command; --list lists: give one of them")
    check_command(args.do)  # here too: no request for a command the owner would refuse
    if args.ranks is not None:
        answers = link.cast(parse_rank_set(args.ranks), args.do)
        if args.json:
            print(json.dumps(answers))
        else:
            sys.stdout.write(cast_text(answers, link.timeout))
        return EXIT_FAILED if any(found.get("error") for found in answers) else EXIT_OK
    if args.rank is None:
        raise DistrunError("--do needs --rank R or --ranks SET: the paused ranks it goes to")
    if args.json:
        raise DistrunError("--json lists, or gives --ranks' answers: not --rank's")
    return _answer(link, args.rank, args.do, args.pid)


def _paused_within(link: OwnerLink, rank: int, timeout: float) -> bool:
    """Whether `rank` is listed paused within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.rank == rank for p in link.paused()[0]):
            return True
        time.sleep(0.1)
    return False


def _with_others(found: PausedRank, paused: list[PausedRank]) -> bool:
    """Whether `found`'s rank has other paused processes (a forked child, a launcher's)."""
    return sum(p.rank == found.rank for p in paused) > 1


def _answer(link: OwnerLink, rank: int, command: str, pid: int | None = None) -> int:
    """`command` to paused rank `rank` (its process `pid`); pdb's answer printed as it is."""
    answer = link.send(rank, command, pid)
    sys.stdout.write(answer["answer"])
    sys.stdout.flush()
    said = after_command(rank, answer, link.timeout)
    if said:
        print(said, file=sys.stderr)
    return EXIT_OK if answer.get("state", "paused") in ("paused", "running") else EXIT_FAILED


def after_command(rank: int | None, answer: dict[str, Any], timeout: float) -> str | None:
    """What a rank did after a command, in one line (None: it waits for the next one): it
    runs on, still runs the command, or ended (how, and why where the job was stopped)."""
    who = f"rank {rank}"
    state = answer.get("state") or ("paused" if answer.get("paused") else "running")
    if state == "paused":
        return None
    if state == "busy":
        return (
            f"{who} still runs the command after {timeout:g} s (its answer is not kept): "
            "it waits in pdb again once the command ends (--list shows it)"
        )
    if state == "ended":
        how = answer.get("exit") or "ended"
        job = answer.get("job")
        because = {"cancelled": "; the job was cancelled", "failed": "; the job failed"}
        return f"{who} {how} during the command" + (
            because.get(job, f"; the job {job}") if job else ""
        )
    return f"{who} runs on"


def _list(
    link: OwnerLink, args: argparse.Namespace, record: JobRecord, failed: Sequence[int] = ()
) -> int:
    """--list, --json: one line (one object) per paused rank; then each of `failed` (a
    warm session's ranks whose last cell raised) not paused, as a post-mortem to be had."""
    if args.rank is not None:
        raise DistrunError("--rank goes with --do (--do 'p x' --rank R) or --interrupt")
    paused, problems = link.paused()
    for problem in problems:
        print(f"warning: {visible(problem)}", file=sys.stderr)
    candidates = [rank for rank in failed if rank not in {p.rank for p in paused}]
    if args.json:
        rows = [listed(p) for p in paused] + [
            dict.fromkeys(LISTED_KEYS) | {"rank": rank, "reason": "post-mortem"}
            for rank in candidates
        ]
        print(json.dumps(rows))
        return EXIT_OK
    for found in paused:
        print(visible(found.line_text(several=_with_others(found, paused))))
    for rank in candidates:
        print(
            f"rank {rank}: its last cell failed (post-mortem): --rank {rank} looks where it "
            "raised, and --do runs a command there"
        )
    if not paused and not candidates:
        print(f"no rank of job {record.job_id} is paused", file=sys.stderr)
    return EXIT_OK
