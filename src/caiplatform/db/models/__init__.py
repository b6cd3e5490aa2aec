"""Every table of the platform. Importing this module registers them all on `Base.metadata`."""

from caiplatform.db.models.agents import Agent, AgentBuild, AgentFile, AgentRevision, AgentSecret  # noqa: F401,E402
from caiplatform.db.models.erasures import Erasure  # noqa: F401
from caiplatform.db.models.identity import (  # noqa: F401
    ApiKey,
    AuditEntry,
    Invitation,
    Org,
    OrgMember,
    PlatformSetting,
    Project,
    ProjectMember,
    ServiceAccount,
    User,
)
from caiplatform.db.models.mcp import McpServer, McpTool, McpVersion  # noqa: F401,E402
from caiplatform.db.models.memorystore import MemoryStoreInstance  # noqa: F401
from caiplatform.db.models.messaging import MessagingSubscription, MessagingTopic  # noqa: F401
from caiplatform.db.models.secrets import SecretBinding  # noqa: F401
from caiplatform.db.models.serverless import (  # noqa: F401,E402
    ServerlessRevision,
    ServerlessService,
    ServerlessTrigger,
    ServerlessTriggerRun,
)
from caiplatform.db.models.vector import VectorIndex  # noqa: F401
