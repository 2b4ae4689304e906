"""Users and API tokens: who may call the server, and whose experiments each may see.

A token is 32 random bytes shown once, when it is made; the database keeps only its SHA-256. A
slow password hash buys nothing here: a token has 256 bits of entropy, so nobody guesses one from
its hash. Tokens travel only in the ``Authorization: Bearer`` header, never in a URL, so no access
log can hold one. A token's id, the first hex digits of its hash, names it in lists and revocations
without revealing it.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from hermes.errors import HermesError
from hermes.store import StoreUnavailable

TOKEN_PREFIX = "hermes_"
TOKEN_ID_LENGTH = 8  # hex digits of the hash that name a token; a revocation takes any unique prefix of them
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")

METADATA = sa.MetaData()
USERS = sa.Table(
    "users",
    METADATA,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("admin", sa.Boolean, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)
TOKENS = sa.Table(
    "tokens",
    METADATA,
    sa.Column("digest", sa.String(64), primary_key=True),  # SHA-256 of the token, in hex
    sa.Column("user", sa.ForeignKey("users.name"), nullable=False),
    sa.Column("label", sa.String(255), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)


class AccountError(HermesError):
    """A user or token cannot be made or revoked: a taken or malformed name, an unknown user or token."""


@dataclass(frozen=True, slots=True)
class User:
    name: str
    admin: bool

    def may_see(self, owner: str | None) -> bool:
        return self.admin or owner == self.name


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """A token as an admin sees it: whose, what for and since when, never the token itself."""

    token_id: str
    user: str
    admin: bool
    label: str
    created_at: float


class Accounts:
    """The users and token digests, in the server's database (SQLite or PostgreSQL)."""

    def __init__(self, url: str) -> None:
        parsed = sa.make_url(url)
        options: dict[str, Any] = {"pool_pre_ping": True}  # a server's connections outlive a PostgreSQL restart
        if parsed.get_backend_name() == "sqlite" and parsed.database:
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            options = {"connect_args": {"timeout": 60.0, "check_same_thread": False}}
        self._engine = sa.create_engine(parsed, **options)
        self._lock = threading.Lock()
        with self._engine.begin() as connection:
            METADATA.create_all(connection)

    def add_user(self, name: str, admin: bool = False) -> str:
        """Create the user and a first token; return the token (it cannot be read back later)."""
        if not _NAME.fullmatch(name):
            raise AccountError(f"user name {name!r}: use 1-64 lower-case letters, digits, '_' or '-', starting "
                               "with a letter")
        with self._lock, self._engine.begin() as connection:
            if connection.execute(sa.select(USERS.c.name).where(USERS.c.name == name)).first() is not None:
                raise AccountError(f"user {name!r} exists already; give them another token with add-token")
            connection.execute(USERS.insert().values(name=name, admin=admin, created_at=time.time()))
            return self._new_token(connection, name, "first token")

    def add_token(self, name: str, label: str = "") -> str:
        with self._lock, self._engine.begin() as connection:
            self._check_user(connection, name)
            return self._new_token(connection, name, label)

    def users(self) -> list[User]:
        with self._engine.connect() as connection:
            rows = connection.execute(sa.select(USERS).order_by(USERS.c.name)).all()
        return [User(row.name, bool(row.admin)) for row in rows]

    def tokens(self, name: str | None = None) -> list[TokenInfo]:
        """Every token (of user ``name``), by user and age."""
        query = (
            sa.select(TOKENS.c.digest, USERS.c.name, USERS.c.admin, TOKENS.c.label, TOKENS.c.created_at)
            .join(TOKENS, TOKENS.c.user == USERS.c.name)
            .order_by(USERS.c.name, TOKENS.c.created_at)
        )
        with self._engine.connect() as connection:
            if name is not None:
                self._check_user(connection, name)
                query = query.where(USERS.c.name == name)
            rows = connection.execute(query).all()
        return [TokenInfo(row[0][:TOKEN_ID_LENGTH], row[1], bool(row[2]), row[3], row[4]) for row in rows]

    def revoke(self, name: str, which: list[str] | None) -> list[str]:
        """Delete user ``name``'s tokens named in ``which`` (ids, unique prefixes of at least four digits, or the
        tokens themselves), or every one of theirs when ``which`` is None; return the ids revoked. Each request
        reads the tokens afresh, so a running server refuses a revoked token at once."""
        with self._lock, self._engine.begin() as connection:
            self._check_user(connection, name)
            digests = connection.execute(sa.select(TOKENS.c.digest).where(TOKENS.c.user == name)).scalars().all()
            chosen = set(digests) if which is None else {_pick(name, digests, wanted) for wanted in which}
            connection.execute(TOKENS.delete().where(TOKENS.c.digest.in_(chosen)))
        return sorted(found[:TOKEN_ID_LENGTH] for found in chosen)

    def user_for(self, token: str) -> User | None:
        """The user a token belongs to, or None for an unknown token. StoreUnavailable where the database cannot be
        read now (PostgreSQL stopped or restarting): every request asks this first, and each was a bare 500."""
        try:
            with self._engine.connect() as connection:
                row = connection.execute(
                    sa.select(USERS.c.name, USERS.c.admin)
                    .join(TOKENS, TOKENS.c.user == USERS.c.name)
                    .where(TOKENS.c.digest == digest(token))
                ).first()
        except sa.exc.OperationalError as error:
            raise StoreUnavailable(f"the users' tokens cannot be read: {error.orig}") from error
        return None if row is None else User(row.name, bool(row.admin))

    def close(self) -> None:
        self._engine.dispose()

    @staticmethod
    def _check_user(connection: sa.Connection, name: str) -> None:
        if connection.execute(sa.select(USERS.c.name).where(USERS.c.name == name)).first() is None:
            raise AccountError(f"no user {name!r}; create them with add-user")

    @staticmethod
    def _new_token(connection: sa.Connection, name: str, label: str) -> str:
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        connection.execute(
            TOKENS.insert().values(digest=digest(token), user=name, label=label, created_at=time.time())
        )
        return token


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def token_id(token: str) -> str:
    return digest(token)[:TOKEN_ID_LENGTH]


def _pick(name: str, digests: list[str], wanted: str) -> str:
    """The one digest of ``name``'s that ``wanted`` (a token, or a prefix of its id) names."""
    if wanted.startswith(TOKEN_PREFIX):
        found = [digest(wanted)] if digest(wanted) in digests else []
        shown = "such token"
    elif len(wanted) >= 4 and re.fullmatch(r"[0-9a-f]+", wanted):
        found = [candidate for candidate in digests if candidate.startswith(wanted)]
        shown = f"token with id {wanted!r}"
    else:
        raise AccountError(f"{wanted!r} is neither a token id (at least 4 of its hex digits, from `hermes server "
                           "tokens`) nor a token")
    if not found:
        raise AccountError(f"{name!r} has no {shown}; `hermes server tokens {name}` lists theirs")
    if len(found) > 1:
        raise AccountError(f"token id {wanted!r} names {len(found)} of {name!r}'s tokens; give more of its digits")
    return found[0]
