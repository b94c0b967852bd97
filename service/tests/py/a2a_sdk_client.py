"""SCD as a remote A2A agent, through the official `a2a-sdk` client (PyPI).

Usage: a2a_sdk_client.py BASE_URL CONTEXT_JSON

Resolves the agent card, sends a compress message (non-streaming and
streaming), reads the task back with GetTask, asks a follow-up question in
the same context, and checks that the confidential field's content never
comes back. Prints one JSON summary line; exits non-zero on any failure.
"""

import asyncio
import json
import sys
import uuid

from google.protobuf import json_format, struct_pb2

from a2a.client import ClientConfig, create_client
from a2a.types import GetTaskRequest, Message, Part, Role, SendMessageRequest

SECRET = "sk_live_SECRET_4242"


def data_part(obj):
    value = struct_pb2.Value()
    json_format.ParseDict(obj, value)
    return Part(data=value)


def message(parts, context_id="", metadata=None):
    m = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=parts, context_id=context_id)
    if metadata:
        m.metadata.update(metadata)
    return SendMessageRequest(message=m)


async def last_task(client, request):
    """The task the agent answered with (the last task or update seen)."""
    task = None
    async for event in client.send_message(request):
        if event.HasField("task"):
            task = event.task
        text = json_format.MessageToJson(event)
        assert SECRET not in text, "the confidential content came back"
    assert task is not None, "no task in the reply"
    return task


async def main(url, context_path):
    context = json.load(open(context_path))
    out = {}
    for streaming in (False, True):
        client = await create_client(url, client_config=ClientConfig(streaming=streaming))
        compress = data_part({"task": "Why are customer charges failing at checkout?", "context": context, "budget": 150})
        task = await last_task(client, message([compress]))
        # the stream may end on a status update: read the task back
        got = await client.get_task(GetTaskRequest(id=task.id))
        text = json_format.MessageToJson(got)
        assert SECRET not in text
        assert got.status.state == 3, f"state {got.status.state}: {text}"  # TASK_STATE_COMPLETED
        artifact = got.artifacts[0]
        data = json_format.MessageToDict(next(p.data for p in artifact.parts if p.HasField("data")))
        assert data["chunks"], data
        assert sum(c["tokens"] for c in data["chunks"]) <= 150, data
        assert data["withheld_fields"] == ["api_keys"], data
        assert data["text"] and sum(c["tokens"] for c in data["chunks"]) > 0, data
        follow = await last_task(
            client,
            message([Part(text="Which log line shows the failure?")], got.context_id, {"currentConfidence": 0.2}),
        )
        again = await client.get_task(GetTaskRequest(id=follow.id))
        assert again.context_id == got.context_id
        assert again.status.state in (3, 2), json_format.MessageToJson(again)  # completed or working
        out["streaming" if streaming else "plain"] = {
            "task": got.id,
            "chunks": len(data["chunks"]),
            "follow_up_state": again.status.state,
        }
        await client.close()
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
