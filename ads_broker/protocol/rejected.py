"""One log line per request for the items (topics, resources) it had rejected."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from ads_broker.exceptions import BrokerError
from ads_broker.protocol.codec import DecodedRequest

if TYPE_CHECKING:
    from ads_broker.protocol.context import HandlerContext

#: Names of rejected topics quoted in a request's one log line.
LOGGED_NAMES = 5


class Rejections:
    """The rejected items of one request, for a single log line naming the client, how many were
    rejected with which codes, the first few names and the first reason."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.codes: Counter[int] = Counter()
        self.names: list[str | None] = []
        self.first: BrokerError | None = None

    def add(self, name: str | None, error: BrokerError, error_code: int | None = None) -> None:
        self.codes[error.error_code if error_code is None else error_code] += 1
        if len(self.names) < LOGGED_NAMES:
            self.names.append(name)
        if self.first is None:
            self.first = error

    def log(self, ctx: HandlerContext, req: DecodedRequest) -> None:
        if not self.codes:
            return
        ctx.log_client_error(req, self.api, self.first, error_code=self.codes.most_common(1)[0][0],
                             rejected=sum(self.codes.values()), error_codes=dict(self.codes), topics=self.names)
