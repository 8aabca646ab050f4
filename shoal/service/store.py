"""The job store: jobs and events in SQLite (default) or PostgreSQL, through SQLAlchemy."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    JSON,
    Float,
    Integer,
    String,
    Text,
    create_engine,
    event,
    select,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column


class Base(DeclarativeBase):
    pass


class JobRow(Base):
    __tablename__ = "jobs"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    workdir: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), index=True)
    submit_time: Mapped[float] = mapped_column(Float)
    start_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    finish_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    failure: Mapped[str | None] = mapped_column(Text, nullable=True)
    batch_size: Mapped[int | None] = mapped_column(Integer, nullable=True)
    allocation: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    history: Mapped[list[Any]] = mapped_column(JSON, default=list)
    num_starts: Mapped[int] = mapped_column(Integer, default=0)
    device_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class EventRow(Base):
    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time: Mapped[float] = mapped_column(Float, index=True)
    job: Mapped[str] = mapped_column(String(128), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    detail: Mapped[str] = mapped_column(Text, default="")


class Store:
    """Thin persistence of the scheduler's records; the service holds one and a lock."""

    def __init__(self, url: str):
        connect_args = {"check_same_thread": False} if url.startswith("sqlite") else {}
        self.url = url
        self.engine = create_engine(url, connect_args=connect_args, pool_pre_ping=True)
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        Base.metadata.create_all(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def next_seq(self) -> int:
        with Session(self.engine) as session:
            rows = session.scalars(select(JobRow.seq).order_by(JobRow.seq.desc()).limit(1)).all()
            return (rows[0] + 1) if rows else 0

    def save_jobs(self, rows: Iterable[dict[str, Any]]) -> None:
        with Session(self.engine) as session, session.begin():
            for data in rows:
                session.merge(JobRow(**data))

    def add_events(self, events: Iterable[tuple[float, str, str, str]]) -> None:
        with Session(self.engine) as session, session.begin():
            session.add_all(EventRow(time=t, job=j, kind=k, detail=d) for t, j, k, d in events)

    def jobs(self) -> list[JobRow]:
        with Session(self.engine, expire_on_commit=False) as session:
            return list(session.scalars(select(JobRow).order_by(JobRow.seq)))

    def events(
        self, job: str | None = None, after_id: int = 0, limit: int = 1000,
        last: int | None = None,
    ) -> list[EventRow]:
        """Events after ``after_id`` in order, at most ``limit``; with ``last``, only the
        newest ``last`` of them (still oldest first)."""
        with Session(self.engine, expire_on_commit=False) as session:
            query = select(EventRow).where(EventRow.id > after_id)
            if job is not None:
                query = query.where(EventRow.job == job)
            if last is not None:
                newest = session.scalars(query.order_by(EventRow.id.desc()).limit(last))
                return list(reversed(list(newest)))
            return list(session.scalars(query.order_by(EventRow.id).limit(limit)))


def _sqlite_pragmas(dbapi_connection: Any, record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
