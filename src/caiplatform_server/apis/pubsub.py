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
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform.validation import resource_segment
from caiplatform_server.app_deps import platform_of, principal_of
from caiplatform_server.http import json_body

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


@router.get(TOPICS, summary="List the project's topics")
async def list_topics(project_id: str, request: Request, principal: Principal = Depends(principal_of),
                      platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    return await platform.topics.list_topics(principal, project_id, **_page_args(request))


@router.post(TOPICS, status_code=201, summary="Create a topic (admin); it starts Pending")
async def create_topic(project_id: str, request: Request, principal: Principal = Depends(principal_of),
                       platform: Platform = Depends(platform_of)) -> JSONResponse:
    body = await json_body(request, OTHER_BODY_LIMIT)
    return JSONResponse(await platform.topics.create_topic(principal, project_id, body), status_code=201)


@router.get(TOPIC, summary="Read a topic")
async def get_topic(project_id: str, topic: str, principal: Principal = Depends(principal_of),
                    platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    return await platform.topics.get_topic(principal, project_id, _topic_name(topic))


@router.patch(TOPIC, summary="Edit a topic (admin)")
async def update_topic(project_id: str, topic: str, request: Request, principal: Principal = Depends(principal_of),
                       platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    body = await json_body(request, OTHER_BODY_LIMIT)
    return await platform.topics.update_topic(principal, project_id, _topic_name(topic), body)


@router.delete(TOPIC, status_code=202, summary="Delete a topic and every subscription (admin)")
async def delete_topic(project_id: str, topic: str, principal: Principal = Depends(principal_of),
                       platform: Platform = Depends(platform_of)) -> JSONResponse:
    result = await platform.topics.delete_topic(principal, project_id, _topic_name(topic))
    return JSONResponse(result, status_code=202)


@router.post(TOPIC, summary="Topic methods: :publish")
async def topic_method(project_id: str, topic: str, request: Request, principal: Principal = Depends(principal_of),
                       platform: Platform = Depends(platform_of)) -> JSONResponse:
    name, verb = _split_verb(topic)
    if verb is None:
        raise MethodNotAllowed(BARE_TOPIC_POST)
    if verb != "publish":
        raise NotFound(unknown_verb(verb))
    body = await json_body(request, PUBLISH_BODY_LIMIT)
    status, result = await platform.topics.publish(principal, project_id, name, body)
    return JSONResponse(result, status_code=status)


@router.get(SUBSCRIPTIONS, summary="List a topic's subscriptions")
async def list_subscriptions(project_id: str, topic: str, request: Request,
                             principal: Principal = Depends(principal_of),
                             platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    return await platform.topics.list_subscriptions(principal, project_id, topic, **_page_args(request))


@router.post(SUBSCRIPTIONS, status_code=201, summary="Create a subscription (admin)")
async def create_subscription(project_id: str, topic: str, request: Request,
                              principal: Principal = Depends(principal_of),
                              platform: Platform = Depends(platform_of)) -> JSONResponse:
    body = await json_body(request, OTHER_BODY_LIMIT)
    result = await platform.topics.create_subscription(principal, project_id, topic, body)
    return JSONResponse(result, status_code=201)


@router.get(SUBSCRIPTION, summary="Read a subscription")
async def get_subscription(project_id: str, topic: str, subscription: str,
                           principal: Principal = Depends(principal_of),
                           platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    return await platform.topics.get_subscription(principal, project_id, topic, _subscription_name(subscription))


@router.patch(SUBSCRIPTION, summary="Edit a subscription (admin)")
async def update_subscription(project_id: str, topic: str, subscription: str, request: Request,
                              principal: Principal = Depends(principal_of),
                              platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    body = await json_body(request, OTHER_BODY_LIMIT)
    return await platform.topics.update_subscription(principal, project_id, topic, _subscription_name(subscription),
                                                     body)


@router.delete(SUBSCRIPTION, status_code=202, summary="Delete a subscription (admin)")
async def delete_subscription(project_id: str, topic: str, subscription: str,
                              principal: Principal = Depends(principal_of),
                              platform: Platform = Depends(platform_of)) -> JSONResponse:
    result = await platform.topics.delete_subscription(principal, project_id, topic, _subscription_name(subscription))
    return JSONResponse(result, status_code=202)


@router.post(SUBSCRIPTION, summary="Subscription methods: :pull, :acknowledge (alias :ack)")
async def subscription_method(project_id: str, topic: str, subscription: str, request: Request,
                              principal: Principal = Depends(principal_of),
                              platform: Platform = Depends(platform_of)) -> JSONResponse:
    name, verb = _split_verb(subscription)
    if verb is None:
        raise MethodNotAllowed(BARE_SUBSCRIPTION_POST)
    if verb == "pull":
        body = await json_body(request, OTHER_BODY_LIMIT, optional=True)
        status, result = await platform.topics.pull(principal, project_id, topic, name, body)
        return JSONResponse(result, status_code=status)
    if verb in ("acknowledge", "ack"):
        body = await json_body(request, OTHER_BODY_LIMIT)
        return JSONResponse(await platform.topics.acknowledge(principal, project_id, topic, name, body))
    raise NotFound(unknown_verb(verb))


@router.get(PROJECT + "/pubsub/quota", summary="The project's storage budget")
async def quota(project_id: str, principal: Principal = Depends(principal_of),
                platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    return await platform.topics.quota(principal, project_id)


@router.get(PROJECT + "/pubsub/usage", summary="Per-topic counters")
async def usage(project_id: str, principal: Principal = Depends(principal_of),
                platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    return await platform.topics.usage(principal, project_id)


@router.get(PROJECT + "/pubsub/credentials", summary="The direct broker credential (admin)")
async def credentials(project_id: str, principal: Principal = Depends(principal_of),
                      platform: Platform = Depends(platform_of)) -> dict[str, Any]:
    return await platform.topics.credentials(principal, project_id)


async def health(platform: Platform) -> tuple[int, dict[str, Any]]:
    """`{status, dependencies: {kubernetes, database, broker, session-key}}`, 200 or 503."""
    return await platform.topics.health()
