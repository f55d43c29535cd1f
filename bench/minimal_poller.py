"""A minimal asyncio IMDS poller: the floor seb's steady-state cost is measured against.

What a careful hand-rolled bridge would do and no more: one aiohttp session with keep-alive, a GET
every second with the Metadata header and api-version, ``orjson.loads`` of the answer. With
``--kafka``, ``--mqtt`` and ``--servicebus`` it also holds the same clients seb would (a
confluent-kafka producer, a paho client on its network thread, an azure-servicebus receiver
waiting on a queue) connected and idle, so the libraries' own cost is in the floor too. It
publishes nothing, keeps no state and validates nothing: seb does all of that on top.

    python bench/minimal_poller.py http://127.0.0.1:PORT/vm/NAME [--kafka HOST:PORT]
        [--mqtt HOST:PORT] [--servicebus CONNECTION_STRING --queue NAME]
"""

import argparse
import asyncio
import contextlib
from typing import Any

import aiohttp
import orjson


async def poll(endpoint: str) -> None:
    url = endpoint + "/metadata/scheduledevents"
    params = {"api-version": "2020-07-01"}
    async with aiohttp.ClientSession(headers={"Metadata": "true"}) as session:
        while True:
            async with session.get(url, params=params, allow_redirects=False) as resp:
                document = orjson.loads(await resp.read())
            if document.get("Events"):
                print(document["DocumentIncarnation"], flush=True)
            await asyncio.sleep(1)


async def servicebus_idle(connection_string: str, queue: str) -> None:
    from azure.servicebus.aio import ServiceBusClient

    async with (
        ServiceBusClient.from_connection_string(connection_string) as client,
        client.get_queue_receiver(queue, max_wait_time=5) as receiver,
    ):
        while True:
            for message in await receiver.receive_messages(max_message_count=1):
                await receiver.complete_message(message)


async def main(args: argparse.Namespace) -> None:
    held: list[Any] = []
    if args.kafka:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": args.kafka, "acks": "all"})
        producer.list_topics(timeout=10)  # connected
        held.append(producer)
    if args.mqtt:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        host, port = args.mqtt.rsplit(":", 1)
        client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        client.connect(host, int(port), keepalive=30)
        client.loop_start()
        held.append(client)
    tasks = [poll(args.endpoint)]
    if args.servicebus:
        tasks.append(servicebus_idle(args.servicebus, args.queue))
    await asyncio.gather(*tasks)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("endpoint")
    parser.add_argument("--kafka")
    parser.add_argument("--mqtt")
    parser.add_argument("--servicebus")
    parser.add_argument("--queue", default="approvals")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(parser.parse_args()))
