"""migratory_client: the Python SDK of the migratory pub/sub server (trio).

async with migratory_client.connect(servers=["ws://127.0.0.1:8800"]) as client:
    async with client.subscribe("/a/b") as subscription:
        async for message in subscription:
            ...
"""

from migratory.model.message import Message, MessageType, Qos
from migratory.model.position import Position
from migratory.model.subject import InvalidSubjectError
from migratory.protocol.ops import Status
from migratory_client.backoff import Backoff, ReconnectPolicy
from migratory_client.client import Client, connect
from migratory_client.errors import (
    ClientClosedError,
    ConnectionClosedError,
    MigratoryError,
    NotConnectedError,
    PublishOutcomeUnknown,
    ServerUnavailableError,
)
from migratory_client.events import Notification, NotificationStatus, PublishResult
from migratory_client.publisher import Publisher
from migratory_client.servers import ServerEntry, choose_server, parse_servers
from migratory_client.session import Keepalive
from migratory_client.subscription import Subscription

__all__ = [
    "Backoff",
    "Client",
    "ClientClosedError",
    "ConnectionClosedError",
    "InvalidSubjectError",
    "Keepalive",
    "Message",
    "MessageType",
    "MigratoryError",
    "NotConnectedError",
    "Notification",
    "NotificationStatus",
    "Position",
    "PublishOutcomeUnknown",
    "PublishResult",
    "Publisher",
    "Qos",
    "ReconnectPolicy",
    "ServerEntry",
    "ServerUnavailableError",
    "Status",
    "Subscription",
    "choose_server",
    "connect",
    "parse_servers",
]
