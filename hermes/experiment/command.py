"""Command templates: a trial's command line with ``{name}`` placeholders, turned into an argv.

The template is split into words first (``shlex``, POSIX rules; no shell ever runs), and only then
is each placeholder replaced inside its word. A value therefore stays exactly one argument, or one
piece of one, whatever it holds: spaces, quotes or ``--evil=1`` never become words of their own.

Placeholders are bare parameter names, ``{lr}``; ``{{`` and ``}}`` are literal braces. Python's
format mini-language is refused: a format spec can hang (``{x:>99999999}`` pads to 100 MB) and
attribute or index access reaches into objects (``{x.__class__}``), and neither is needed to put a
value into a command line. Quotes only group words: a placeholder inside quotes is replaced too.

``{trial_dir}`` is the trial's own folder (the one ``HERMES_TRIAL_DIR`` names), for a program that writes its files
by relative path into its working directory, which all trials share: it is known only where the trial is launched,
so the argv holds TRIAL_DIR_MARK in its place until ``with_trial_dir`` fills it in. A parameter of the search space
named ``trial_dir`` fills it instead, as any parameter fills its placeholder.

Since no shell runs the command, ``check_shell_words`` refuses a word a shell would act on: an operator (``> out.log``,
``2>&1``, ``|``, ``&&``, ``;``) or a leading ``~`` unquoted, and a variable (``$HOME``, ``${X}``, ``$1``, ``$@``) or a
command substitution (``$(cmd)``) unquoted or in double quotes, where a shell expands them too; each reached the program
as literal text. In single quotes (``'a > b'``, ``'$HOME'``) it is text, as in a shell, and the script of ``bash -c
SCRIPT`` is that shell's own to expand. It checks a command given now (a new experiment, a submission), never one read
back from a store: that one ran as written before the check was made, and a rerun or a pool continues it so.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from hermes.errors import HermesError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REFUSED = {  # the first of these characters in a placeholder says what it tried to do
    ":": "format specs are",
    "!": "conversions are",
    ".": "attribute access is",
    "[": "index access is",
}


TRIAL_DIR = "trial_dir"  # the placeholder of the trial's own folder
# what stands for it in an argv until the trial is launched: no argument holds a NUL (a template or value with one is
# refused), so the mark is never text of the command's own
TRIAL_DIR_MARK = "\0trial_dir\0"


class CommandError(HermesError):
    """A command template cannot be parsed, or cannot be filled with a trial's parameters."""


@dataclass(frozen=True, slots=True)
class Placeholder:
    name: str


Word = tuple[str | Placeholder, ...]  # literal text and placeholders, in order


@dataclass(frozen=True, slots=True)
class CommandTemplate:
    """A parsed template: its words, each a sequence of literal text and placeholders."""

    text: str
    words: tuple[Word, ...]

    @property
    def placeholders(self) -> tuple[str, ...]:
        """The parameter names used, in order of first use."""
        names = (part.name for word in self.words for part in word if isinstance(part, Placeholder))
        return tuple(dict.fromkeys(names))

    def argv(self, params: Mapping[str, Any]) -> tuple[str, ...]:
        """One argument per word of the template, each placeholder replaced by ``str(value)``."""
        argv = []
        for word in self.words:
            pieces = []
            for part in word:
                if isinstance(part, str):
                    pieces.append(part)
                    continue
                if part.name not in params and part.name == TRIAL_DIR:  # filled where the trial is launched
                    pieces.append(TRIAL_DIR_MARK)
                    continue
                if part.name not in params:
                    known = ", ".join(params) or "none"
                    raise CommandError(f"{self.text!r}: placeholder {{{part.name}}} has no value (parameters: {known})")
                value = str(params[part.name])
                if "\0" in value:
                    raise CommandError(f"{self.text!r}: the value of {{{part.name}}} holds a NUL character, "
                                       "which no command-line argument can carry")
                pieces.append(value)
            argv.append("".join(pieces))
        return tuple(argv)


@lru_cache(maxsize=64)
def parse_template(template: str) -> CommandTemplate:
    """Split ``template`` into words, then find the placeholders of each; CommandError says what is wrong."""
    try:
        words = shlex.split(template)
    except ValueError as error:  # unbalanced quotes, a trailing backslash
        raise CommandError(f"cannot parse {template!r}: {str(error).lower()}") from None
    if not words:
        raise CommandError("must not be empty")
    if "\0" in template:
        raise CommandError("holds a NUL character, which no command-line argument can carry")
    return CommandTemplate(template, tuple(_parts(word) for word in words))


def validate_template(template: str, names: Collection[str]) -> CommandTemplate:
    """Parse ``template`` and check that every placeholder is one of ``names`` (the search space), or {trial_dir}."""
    parsed = parse_template(template)
    for name in parsed.placeholders:
        if name not in names and name != TRIAL_DIR:
            variable = f"${{{name}}}"
            shell = (f"; {variable} reads as a shell's variable, but no shell runs the command: run it through one "
                     f"(bash -c '...', docs/trials.md), the shell's braces doubled, ${{{{{name}}}}}"
                     if variable in template else "")
            raise CommandError(f"placeholder {{{name}}} is not in search.space (parameters: {', '.join(names)}), "
                               f"nor {{{TRIAL_DIR}}}, the trial's own folder{shell}")
    return parsed


def command_argv(template: str, params: Mapping[str, Any]) -> tuple[str, ...]:
    """The argv of a trial: ``template`` split into words, its placeholders filled from ``params``."""
    return parse_template(template).argv(params)


def with_trial_dir(argv: Sequence[str], directory: str) -> list[str]:
    """``argv`` with the trial's folder, ``directory``, where ``{trial_dir}`` was."""
    return [argument.replace(TRIAL_DIR_MARK, directory) for argument in argv]


def check_shell_words(template: str) -> None:
    """Refuse a word of ``template`` (which ``parse_template`` takes) that a shell would act on, but that reaches the
    program as it is written: only for a command given now, never a stored one (the module's docstring says why)."""
    words = _words(template)
    script = _script_index([word for word, _ in words])
    for index, (_, written) in enumerate(words):
        if index != script:
            _check_not_shell(written)


def _words(template: str) -> list[tuple[str, str]]:
    """``shlex.split(template)``, each word with its text as written (quotes and backslashes kept), which says what
    a shell would have read unquoted."""
    lexer = shlex.shlex(template, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = ""  # as shlex.split's: a # is text
    words = []
    start = 0
    while (word := lexer.get_token()) is not None:
        end = lexer.instream.tell()  # past the word and the one blank that ended it
        words.append((word, template[start:end].strip(lexer.whitespace)))
        start = end
    return words


_SHELLS = {"sh", "bash", "zsh", "dash", "ksh"}
_SCRIPT_FLAG = re.compile(r"-[A-Za-z]*c[A-Za-z]*")  # -c, or among others: -lc, -ec, -ce
_TAKES_A_VALUE = {"-o", "+o", "-O", "+O"}  # bash -o pipefail -c '...'


def _script_index(words: list[str]) -> int | None:
    """Where the script of ``bash -c SCRIPT`` (or sh, zsh, ..., with -lc, -ec alike) stands among ``words``: that
    shell expands its variables itself. None where the command runs no shell's -c."""
    if os.path.basename(words[0]) not in _SHELLS:
        return None
    for index in range(1, len(words)):
        if _SCRIPT_FLAG.fullmatch(words[index]):
            return index + 1
        if not words[index].startswith(("-", "+")) and words[index - 1] not in _TAKES_A_VALUE:
            return None  # a script file: what follows is its arguments
    return None


_OPERATORS = {"|": "a pipe", "|&": "a pipe", "||": "a command list", "&&": "a command list", ";": "a command list",
              "&": "a background job", "<": "a redirection", "<<": "a redirection", "<<<": "a redirection"}
_REDIRECTION = re.compile(r"[0-9]*>|&>")  # > out.log, >> out.log, 2> err.log, 2>&1, &> all.log, >out.log
# $HOME, ${HOME}, $(command), `command`; a shell's own parameters: $1, $@, $*, $#, $?, $$, $!, $-
_EXPANSION = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[^}]*\}?|\(|[0-9@*#?$!-])|`")
_NO_SHELL = "but the command is not run by a shell, so the program would get it"
_USE_A_SHELL = "run the command through a shell (bash -c '...', docs/trials.md), or quote the word to pass it as it is"
_QUOTED = "\0"  # stands for a quoted or escaped character: no template holds a NUL


def _check_not_shell(written: str) -> None:
    """Refuse a word (as written) that a shell would act on: an operator or a leading ``~`` unquoted, a variable or
    a command substitution unquoted or in double quotes."""
    bare = _unquoted(written)
    what = _OPERATORS.get(bare) or ("a redirection" if _REDIRECTION.match(bare) else None)
    if what is not None:
        raise CommandError(f"{written!r} is shell syntax ({what}), {_NO_SHELL} as an argument: {_USE_A_SHELL}")
    expansion = _EXPANSION.search(_unquoted(written, expand_in_double_quotes=True))
    if expansion is not None:
        found = {"$(": "$(...)", "`": "`...`"}.get(expansion[0], expansion[0])
        if found in ("$(...)", "`...`"):
            what = "a command substitution"
        else:
            what = "an environment variable" if _NAME.match(found.lstrip("${")) else "a shell parameter"
        placeholder = f" (a placeholder is {found[1:]}, without $)" if found.startswith("${") else ""
        quoted = ", which a shell expands in double quotes too" if bare[expansion.start()] == _QUOTED else ""
        raise CommandError(f"{written!r} holds {found}, {what}{placeholder}{quoted}, {_NO_SHELL} unexpanded: write "
                           "the value out, run the command through a shell (bash -c '...', docs/trials.md), or put "
                           "the word in single quotes to pass it as it is")
    if bare.startswith("~"):
        raise CommandError(f"{written!r} starts with ~, a home folder to a shell, {_NO_SHELL} as it is: write the "
                           f"path out, {_USE_A_SHELL}")


def _unquoted(written: str, expand_in_double_quotes: bool = False) -> str:
    """``written`` with each quote, backslash and character they protect replaced by _QUOTED (POSIX rules, as
    shlex's: nothing escapes in single quotes, only \\ and \" in double quotes). ``expand_in_double_quotes``: what
    double quotes hold is left as it is, as a shell still expands a ``$`` there."""
    bare = []
    quote = None
    index = 0
    while index < len(written):
        char = written[index]
        escapes = char == "\\" and (quote is None or quote == '"' and written[index + 1 : index + 2] in '"\\')
        if escapes:
            bare.append(_QUOTED * len(written[index : index + 2]))  # the backslash and what it escapes
            index += 2
            continue
        if quote is None and char in "'\"" or char == quote:  # one that opens or closes
            quote = char if quote is None else None
            bare.append(_QUOTED)
        else:
            bare.append(char if quote is None or quote == '"' and expand_in_double_quotes else _QUOTED)
        index += 1
    return "".join(bare)


def _parts(word: str) -> Word:
    parts: list[str | Placeholder] = []
    literal: list[str] = []
    index = 0
    while index < len(word):
        char = word[index]
        if char in "{}" and word.startswith(char * 2, index):  # {{ or }}: a literal brace
            literal.append(char)
            index += 2
        elif char == "}":
            raise CommandError(f"single '}}' in {word!r}; write }}}} for a literal brace")
        elif char == "{":
            end = word.find("}", index)
            if end < 0:
                raise CommandError(f"unclosed placeholder in {word!r} (a placeholder never spans words); "
                                   "write {{ for a literal brace")
            field = word[index + 1 : end]
            _check_field(field)
            if literal:
                parts.append("".join(literal))
                literal = []
            parts.append(Placeholder(field))
            index = end + 1
        else:
            literal.append(char)
            index += 1
    if literal:
        parts.append("".join(literal))
    return tuple(parts)


def _check_field(field: str) -> None:
    if _NAME.fullmatch(field):
        return
    refused = [(field.find(char), what) for char, what in _REFUSED.items() if char in field]
    if refused and _NAME.fullmatch(field[: min(refused)[0]]):
        what = min(refused)[1]
        raise CommandError(f"{{{field}}}: {what} not allowed; a placeholder is a bare parameter name like "
                           f"{{{field[: min(refused)[0]]}}} (format the value in the program)")
    raise CommandError(f"{{{field}}}: placeholders must name a parameter, like {{lr}}; "
                       "write {{ and }} for literal braces")
