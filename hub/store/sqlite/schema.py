"""The SQLite schema: versioned migrations, applied in one transaction at open."""

from __future__ import annotations

import logging
import sqlite3

from protocol import StoreError

from .packing import EVENT_TYPES, ROLES, TEXT_HEAD, TEXT_TAIL

__all__ = ["MIGRATIONS", "migrate"]

log = logging.getLogger("sessionhub.store")

# Versioned migrations: index i brings the schema from user_version i to i + 1.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        parent_session_id TEXT,
        model TEXT,
        source TEXT,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        estimated_cost REAL NOT NULL DEFAULT 0,
        end_reason TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE INDEX sessions_updated ON sessions(updated_at);

    CREATE TABLE messages (
        pk INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL,
        id TEXT NOT NULL,
        parent_pk INTEGER,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE UNIQUE INDEX messages_id ON messages(session_id, id);
    CREATE INDEX messages_session ON messages(session_id);
    CREATE INDEX messages_children ON messages(parent_pk);

    CREATE VIRTUAL TABLE messages_fts USING fts5(sid, body, tokenize='porter unicode61');
    INSERT INTO messages_fts(messages_fts, rank) VALUES ('rank', 'bm25(0.0, 1.0)');

    CREATE TABLE compactions (
        pk INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL,
        id TEXT NOT NULL,
        summary TEXT NOT NULL,
        from_message_id TEXT NOT NULL,
        to_message_id TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE UNIQUE INDEX compactions_id ON compactions(session_id, id);

    CREATE TABLE streams (
        stream TEXT PRIMARY KEY,
        epoch TEXT NOT NULL,
        first_seq INTEGER NOT NULL,
        last_seq INTEGER NOT NULL
    ) WITHOUT ROWID;

    CREATE TABLE events (
        stream TEXT NOT NULL,
        seq INTEGER NOT NULL,
        session_id TEXT NOT NULL,
        type TEXT NOT NULL,
        data TEXT NOT NULL,
        created_at REAL NOT NULL,
        PRIMARY KEY (stream, seq)
    ) WITHOUT ROWID;
    """,
    """
    CREATE TABLE context_blocks (
        key TEXT PRIMARY KEY,
        content TEXT NOT NULL,
        updated_at REAL NOT NULL
    ) WITHOUT ROWID;

    CREATE TABLE search_entries (
        pk INTEGER PRIMARY KEY,
        label TEXT NOT NULL,
        key TEXT NOT NULL,
        content TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE UNIQUE INDEX search_entries_key ON search_entries(label, key);

    CREATE VIRTUAL TABLE search_fts USING fts5(lbl, body, tokenize='porter unicode61');
    INSERT INTO search_fts(search_fts, rank) VALUES ('rank', 'bm25(0.0, 1.0)');
    """,
    """
    CREATE TABLE session_stats (
        session_id TEXT PRIMARY KEY,
        messages INTEGER NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO session_stats (session_id, messages)
        SELECT session_id, COUNT(*) FROM messages GROUP BY session_id;
    """,
    # Facts about how the database is served, e.g. the bus its nodes ring each other on
    # (hub/apps/backends.py: a node on another bus would miss their live events).
    """
    CREATE TABLE settings (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL,
        updated_at REAL NOT NULL
    ) WITHOUT ROWID;
    """,
    # The footprint (docs/operations.md, "Sizes"): the full-text index keeps no copy of the
    # text (contentless: a removal hands back the words it indexed, re-derived from the
    # stored message by Message.text()), and a message.appended event refers to its message
    # (events.ref = messages.pk; data holds only the parent id) until the message is updated
    # or deleted, when the event gets the body it had (messages.event_seq finds the event).
    # Existing events keep their full bodies (ref NULL): they read back the same.
    """
    CREATE VIRTUAL TABLE messages_fts_new USING fts5(sid, body, content='', tokenize='porter unicode61');
    INSERT INTO messages_fts_new(messages_fts_new, rank) VALUES ('rank', 'bm25(0.0, 1.0)');
    INSERT INTO messages_fts_new(rowid, sid, body) SELECT rowid, sid, body FROM messages_fts;
    DROP TABLE messages_fts;
    ALTER TABLE messages_fts_new RENAME TO messages_fts;
    ALTER TABLE messages ADD COLUMN event_seq INTEGER;
    ALTER TABLE events ADD COLUMN ref INTEGER;
    """,
    # The footprint, part 2: a log gets a small integer key (streams.sk), and a session's
    # key is its own log's, so that messages and events hold 1-2 bytes where they held the
    # 36-character session id (twice per event: in the stream and in session_id, which is
    # now NULL for an event of the session's own log). An event's type and a message's
    # role are codes (packing.EVENT_TYPES, ROLES), and a message's content leaves out the id and role its
    # columns hold (packing.packed). A message.appended event that refers to its message
    # stores neither its data (the parent id) nor its time while its message's row holds
    # both (NULL: sql.read_events reads them from the row). What reads back is unchanged.
    """
    CREATE TABLE streams_new (
        stream TEXT PRIMARY KEY,
        sk INTEGER NOT NULL UNIQUE,
        epoch TEXT NOT NULL,
        first_seq INTEGER NOT NULL,
        last_seq INTEGER NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO streams_new
        SELECT stream, ROW_NUMBER() OVER (ORDER BY stream), epoch, first_seq, last_seq FROM streams;
    INSERT INTO streams_new
        SELECT k.stream,
               (SELECT COALESCE(MAX(sk), 0) FROM streams_new) + ROW_NUMBER() OVER (ORDER BY k.stream),
               lower(hex(randomblob(8))), 1, 0
        FROM (SELECT DISTINCT 's:' || session_id AS stream FROM messages) k
        WHERE k.stream NOT IN (SELECT stream FROM streams_new);
    CREATE TABLE events_new (
        sk INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        session_id TEXT,
        type NOT NULL,
        data TEXT,
        created_at REAL,
        ref INTEGER,
        PRIMARY KEY (sk, seq)
    ) WITHOUT ROWID;
    INSERT INTO events_new
        SELECT s.sk, e.seq, CASE WHEN e.stream = 's:' || e.session_id THEN NULL ELSE e.session_id END,
               CASE e.type TYPE_CODES ELSE e.type END, e.data, e.created_at, e.ref
        FROM events e JOIN streams_new s ON s.stream = e.stream;
    DROP TABLE events;
    ALTER TABLE events_new RENAME TO events;
    DROP TABLE streams;
    ALTER TABLE streams_new RENAME TO streams;
    CREATE TABLE messages_new (
        pk INTEGER PRIMARY KEY,
        sk INTEGER NOT NULL,
        id TEXT NOT NULL,
        parent_pk INTEGER,
        role NOT NULL,
        content TEXT NOT NULL,
        created_at REAL NOT NULL,
        event_seq INTEGER
    );
    INSERT INTO messages_new
        SELECT r.pk, s.sk, r.id, r.parent_pk, CASE r.role ROLE_CODES ELSE r.role END,
               CASE WHEN r.rest IS NULL THEN r.content
                    WHEN substr(r.rest, 1, length('TEXT_HEAD') + 1) = 'TEXT_HEAD' || '"'
                         AND substr(r.rest, -4) = '"' || 'TEXT_TAIL'
                    THEN substr(r.rest, length('TEXT_HEAD') + 1, length(r.rest) - length('TEXT_HEAD') - 3)
                    ELSE r.rest END,
               r.created_at, r.event_seq
        FROM (
            SELECT m.*, CASE WHEN substr(m.content, 1, length(m.p)) = m.p
                                  AND substr(m.content, length(m.p) + 1, 1) IN (',', '}')
                             THEN substr(m.content, length(m.p) + 1) END AS rest
            FROM (SELECT *, '{"id":' || json_quote(id) || ',"role":' || json_quote(role) AS p FROM messages) m
        ) r
        JOIN streams s ON s.stream = 's:' || r.session_id;
    DROP TABLE messages;
    ALTER TABLE messages_new RENAME TO messages;
    CREATE UNIQUE INDEX messages_id ON messages(sk, id);
    CREATE INDEX messages_session ON messages(sk);
    CREATE INDEX messages_children ON messages(parent_pk)
    """.replace("TYPE_CODES", " ".join(f"WHEN '{name}' THEN {code}" for code, name in enumerate(EVENT_TYPES)))
    .replace("ROLE_CODES", " ".join(f"WHEN '{name}' THEN {code}" for code, name in enumerate(ROLES)))
    .replace("TEXT_HEAD", TEXT_HEAD)
    .replace("TEXT_TAIL", TEXT_TAIL),
    # A long message's content may now be a deflated BLOB (packing.DEFLATE_AT). Nothing is
    # rewritten: rows stay as they are until they change. The version is there so that an
    # older sessionhub, which would take a BLOB for text, refuses the file instead.
    "",
    # LangGraph checkpoints of a session (protocol/graphstate.py): the serializer's bytes
    # as BLOBs, the metadata as JSON (list filters on it), keyed by the session's id as
    # LangGraph keys by thread. Writes go with their checkpoint (delete and prune).
    """
    CREATE TABLE graph_checkpoints (
        session_id TEXT NOT NULL,
        ns TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        parent_id TEXT,
        type TEXT NOT NULL,
        data BLOB NOT NULL,
        metadata TEXT NOT NULL,
        run_id TEXT,
        PRIMARY KEY (session_id, ns, checkpoint_id)
    ) WITHOUT ROWID;
    CREATE INDEX graph_checkpoints_run ON graph_checkpoints(run_id) WHERE run_id IS NOT NULL;
    CREATE TABLE graph_writes (
        session_id TEXT NOT NULL,
        ns TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        task_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        channel TEXT NOT NULL,
        type TEXT NOT NULL,
        value BLOB NOT NULL,
        task_path TEXT NOT NULL,
        PRIMARY KEY (session_id, ns, checkpoint_id, task_id, idx)
    ) WITHOUT ROWID
    """,
    # Files in messages (docs/files.md), stored once by SHA-256 in 1 MiB chunks (a range
    # reads only its chunks; a rowid table, as SQLite keeps big values out of a WITHOUT
    # ROWID table's b-tree pages badly). file_refs: which message (pk) of which session
    # (sk) references which file, written with the message; a deleted message's go with it.
    """
    CREATE TABLE files (
        sha256 TEXT PRIMARY KEY,
        size INTEGER NOT NULL,
        media_type TEXT NOT NULL,
        touched_at REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE file_chunks (
        sha256 TEXT NOT NULL,
        n INTEGER NOT NULL,
        data BLOB NOT NULL
    );
    CREATE UNIQUE INDEX file_chunks_key ON file_chunks(sha256, n);
    CREATE TABLE file_uploads (
        sha256 TEXT NOT NULL,
        subject TEXT NOT NULL,
        PRIMARY KEY (sha256, subject)
    ) WITHOUT ROWID;
    CREATE TABLE file_refs (
        pk INTEGER NOT NULL,
        sha256 TEXT NOT NULL,
        sk INTEGER NOT NULL,
        PRIMARY KEY (pk, sha256)
    ) WITHOUT ROWID;
    CREATE INDEX file_refs_sha ON file_refs(sha256, sk);
    CREATE TRIGGER file_refs_gone AFTER DELETE ON messages BEGIN DELETE FROM file_refs WHERE pk = old.pk; END
    """,
]

#: The migrations up to this version rewrite tables (announced: they take a while).
_REWRITES = 6


def _announce(conn: sqlite3.Connection, version: int) -> None:
    # Migration 6 rewrites the messages and events tables: minutes on a big file, during
    # which `serve` would otherwise sit silent before it listens.
    (messages,) = conn.execute("SELECT COALESCE(MAX(pk), 0) FROM messages").fetchone()
    log.warning(
        "upgrading the database from schema version %d to %d (~%d messages; "
        "about 2 s per 100,000 on a small machine, once)",
        version,
        len(MIGRATIONS),
        messages,
    )


def migrate(conn: sqlite3.Connection) -> int:
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > len(MIGRATIONS):
            raise StoreError(
                f"database schema version {version} is newer than "
                f"this sessionhub supports ({len(MIGRATIONS)})"
            )
        if 0 < version < _REWRITES:
            _announce(conn, version)
        for i in range(version, len(MIGRATIONS)):
            for statement in MIGRATIONS[i].split(";\n"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {i + 1}")
        conn.execute("COMMIT")
    except BaseException:
        conn.rollback()
        raise
    return len(MIGRATIONS)
