"""Messaging API (document 3): topics, subscriptions, publish, pull, acknowledge, quota, usage, credentials.

Routes decode, make one `TopicService` call and encode; the rules live in the service. Verbs ride on
the last path segment (`.../topics/<name>:publish`, `.../subscriptions/<name>:pull`), so POST to a topic
or subscription dispatches on the suffix: none is 405, an unknown one 404.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from caiplatform.domain.messaging import (
    BARE_SUBSCRIPTION_POST,
    BARE_TOPIC_POST,
    OTHER_BODY_LIMIT,
    PUBLISH_BODY_LIMIT,
    SUBSCRIPTION_VERBS,
    TOPIC_VERBS,
    unknown_verb,
)
from caiplatform.errors import MethodNotAllowed, NotFound
from caiplatform.models import messaging as views
from caiplatform.models.messaging import (
    AcknowledgeRequest,
    PublishRequest,
    PullRequest,
    SubscriptionCreate,
    SubscriptionPatch,
    TopicCreate,
    TopicPatch,
)
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform.validation import resource_segment
from caiplatform.web.http import json_body
from caiplatform_server.app_deps import caller_of, platform_of, principal_of
from caiplatform_server.contract import operation, reply

router = APIRouter(tags=["pubsub"])

PROJECT = "/v1/projects/{project_id}"
TOPICS = PROJECT + "/topics"
TOPIC = TOPICS + "/{topic}"
SUBSCRIPTIONS = TOPIC + "/subscriptions"
SUBSCRIPTION = SUBSCRIPTIONS + "/{subscription}"


def _page_args(request: Request) -> dict[str, Any]:
    query = request.query_params
    return {"page_size": query.get("page_size", query.get("limit")), "page_token": query.get("page_token")}


def _topic_name(segment: str) -> str:
    return resource_segment(segment, TOPIC_VERBS, unknown_verb)


def _subscription_name(segment: str) -> str:
    return resource_segment(segment, SUBSCRIPTION_VERBS, unknown_verb)


def _split_verb(segment: str) -> tuple[str, str | None]:
    name, colon, verb = segment.partition(":")
    return name, (verb if colon else None)


@router.get(TOPICS, summary="List the project's topics",
            **operation(response=views.TopicList, paginated=True, errors=(403, 404)))
async def list_topics(project_id: str, request: Request, principal: Principal = Depends(principal_of),
                      platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.topics.list_topics(principal, project_id, **_page_args(request)))


@router.post(TOPICS, summary="Create a topic (admin); it starts Pending",
             **operation(body=TopicCreate, response=views.Topic, status=201, errors=(403, 404, 409, 413, 500)))
async def create_topic(project_id: str, request: Request, principal: Principal = Depends(principal_of),
                       platform: Platform = Depends(platform_of)) -> JSONResponse:
    body = TopicCreate.parse(await json_body(request, OTHER_BODY_LIMIT))
    return reply(await platform.topics.create_topic(principal, project_id, body), status=201)


@router.get(TOPIC, summary="Read a topic", **operation(response=views.Topic, errors=(403, 404, 405)))
async def get_topic(project_id: str, topic: str, principal: Principal = Depends(principal_of),
                    platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.topics.get_topic(principal, project_id, _topic_name(topic)))


@router.patch(TOPIC, summary="Edit a topic (admin)",
              **operation(body=TopicPatch, response=views.Topic, errors=(403, 404, 405, 409, 413, 500)))
async def update_topic(project_id: str, topic: str, request: Request, principal: Principal = Depends(principal_of),
                       platform: Platform = Depends(platform_of)) -> JSONResponse:
    name = _topic_name(topic)
    body = TopicPatch.parse(await json_body(request, OTHER_BODY_LIMIT))
    return reply(await platform.topics.update_topic(principal, project_id, name, body))


@router.delete(TOPIC, summary="Delete a topic and every subscription (admin)",
               **operation(response=views.PubsubDeletion, status=202, errors=(403, 404, 405)))
async def delete_topic(project_id: str, topic: str, principal: Principal = Depends(principal_of),
                       platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.topics.delete_topic(principal, project_id, _topic_name(topic)), status=202)


IDEMPOTENCY_KEY_HEADER = {
    "name": "Idempotency-Key", "in": "header", "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[!-~]+$"},
    "description": (
        "Makes a retried publish store each message once: the same key, caller and messages within two "
        "minutes of the first attempt answer the same message_ids and store nothing again. Retry a 503 "
        "or a 207 with the key of the request it answered; a new request takes a new key."),
}


@router.post(TOPIC, summary="Topic methods: :publish",
             **operation(body=PublishRequest, response=views.PublishResult, other_success={207: views.PublishPartial},
                         errors=(403, 404, 405, 409, 413, 500), query=[IDEMPOTENCY_KEY_HEADER]))
async def topic_method(project_id: str, topic: str, request: Request) -> JSONResponse:
    # Only `request` and the path: the conventions middleware calls it directly (`dispatch.RouteTable`),
    # without FastAPI's routing over every route and its dependency solving (docs/performance.md).
    platform, principal = caller_of(request)
    name, verb = _split_verb(topic)
    if verb is None:
        raise MethodNotAllowed(BARE_TOPIC_POST)
    if verb != "publish":
        raise NotFound(unknown_verb(verb))
    body = PublishRequest.parse(await json_body(request, PUBLISH_BODY_LIMIT))
    status, result = await platform.topics.publish(principal, project_id, name, body,
                                                   request.headers.get("idempotency-key"))
    return reply(result, status)


@router.get(SUBSCRIPTIONS, summary="List a topic's subscriptions",
            **operation(response=views.SubscriptionList, paginated=True, errors=(403, 404)))
async def list_subscriptions(project_id: str, topic: str, request: Request,
                             principal: Principal = Depends(principal_of),
                             platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.topics.list_subscriptions(principal, project_id, topic, **_page_args(request)))


@router.post(SUBSCRIPTIONS, summary="Create a subscription (admin)",
             **operation(body=SubscriptionCreate, response=views.Subscription, status=201,
                         errors=(403, 404, 409, 413, 500)))
async def create_subscription(project_id: str, topic: str, request: Request,
                              principal: Principal = Depends(principal_of),
                              platform: Platform = Depends(platform_of)) -> JSONResponse:
    body = SubscriptionCreate.parse(await json_body(request, OTHER_BODY_LIMIT))
    return reply(await platform.topics.create_subscription(principal, project_id, topic, body), status=201)


@router.get(SUBSCRIPTION, summary="Read a subscription",
            **operation(response=views.Subscription, errors=(403, 404, 405)))
async def get_subscription(project_id: str, topic: str, subscription: str,
                           principal: Principal = Depends(principal_of),
                           platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.topics.get_subscription(principal, project_id, topic, _subscription_name(subscription)))


@router.patch(SUBSCRIPTION, summary="Edit a subscription (admin)",
              **operation(body=SubscriptionPatch, response=views.Subscription, errors=(403, 404, 405, 413, 500)))
async def update_subscription(project_id: str, topic: str, subscription: str, request: Request,
                              principal: Principal = Depends(principal_of),
                              platform: Platform = Depends(platform_of)) -> JSONResponse:
    name = _subscription_name(subscription)
    body = SubscriptionPatch.parse(await json_body(request, OTHER_BODY_LIMIT))
    return reply(await platform.topics.update_subscription(principal, project_id, topic, name, body))


@router.delete(SUBSCRIPTION, summary="Delete a subscription (admin)",
               **operation(response=views.PubsubDeletion, status=202, errors=(403, 404, 405)))
async def delete_subscription(project_id: str, topic: str, subscription: str,
                              principal: Principal = Depends(principal_of),
                              platform: Platform = Depends(platform_of)) -> JSONResponse:
    name = _subscription_name(subscription)
    return reply(await platform.topics.delete_subscription(principal, project_id, topic, name), status=202)


@router.post(SUBSCRIPTION, summary="Subscription methods: :pull, :acknowledge (alias :ack)",
             **operation(body=(PullRequest, AcknowledgeRequest), body_required=False,
                         response=(views.PullResult, views.AcknowledgeResult), other_success={207: views.PullResult},
                         errors=(403, 404, 405, 409, 413, 500)))
async def subscription_method(project_id: str, topic: str, subscription: str, request: Request) -> JSONResponse:
    platform, principal = caller_of(request)  # called directly, as `topic_method` is
    name, verb = _split_verb(subscription)
    if verb is None:
        raise MethodNotAllowed(BARE_SUBSCRIPTION_POST)
    if verb == "pull":
        pull = PullRequest.parse(await json_body(request, OTHER_BODY_LIMIT, optional=True))
        status, pulled = await platform.topics.pull(principal, project_id, topic, name, pull)
        return reply(pulled, status)
    if verb in ("acknowledge", "ack"):
        ack = AcknowledgeRequest.parse(await json_body(request, OTHER_BODY_LIMIT))
        return reply(await platform.topics.acknowledge(principal, project_id, topic, name, ack))
    raise NotFound(unknown_verb(verb))


@router.get(PROJECT + "/pubsub/quota", summary="The project's storage budget",
            **operation(response=views.PubsubQuota, errors=(403, 404)))
async def quota(project_id: str, principal: Principal = Depends(principal_of),
                platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.topics.quota(principal, project_id))


@router.get(PROJECT + "/pubsub/usage", summary="Per-topic counters",
            **operation(response=views.PubsubUsage, errors=(403, 404)))
async def usage(project_id: str, principal: Principal = Depends(principal_of),
                platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.topics.usage(principal, project_id))


@router.get(PROJECT + "/pubsub/credentials", summary="The direct broker credential (admin)",
            **operation(response=views.BrokerCredentialView, errors=(403, 404)))
async def credentials(project_id: str, principal: Principal = Depends(principal_of),
                      platform: Platform = Depends(platform_of)) -> JSONResponse:
    return reply(await platform.topics.credentials(principal, project_id))


async def health(platform: Platform) -> tuple[int, dict[str, Any]]:
    """`{status, dependencies: {kubernetes, database, broker, session-key}}`, 200 or 503."""
    status, body = await platform.topics.health()
    return status, body.to_json()
