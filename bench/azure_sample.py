"""The polling loop of the Azure documentation's Python sample (seed 003), for comparison.

Same calls as the sample: ``requests.get`` with the Metadata header and api-version, one new
connection per request, ``sleep(1)`` between polls, events processed per changed incarnation.
Only the endpoint is a parameter, so it can poll the simulator.
"""

import json
import sys
from time import sleep

import requests

metadata_url = sys.argv[1] + "/metadata/scheduledevents"
header = {"Metadata": "true"}
query_params = {"api-version": "2020-07-01"}


def get_scheduled_events():
    resp = requests.get(metadata_url, headers=header, params=query_params)
    data = resp.json()
    return data


def log(event):
    print(event.get("Description", ""))


def advanced_sample(last_document_incarnation):
    found_document_incarnation = last_document_incarnation
    while last_document_incarnation == found_document_incarnation:
        sleep(1)
        payload = get_scheduled_events()
        found_document_incarnation = payload["DocumentIncarnation"]
    for event in payload["Events"]:
        if event["EventStatus"] == "Started":
            log(event)
        else:
            log(event)
    print("Processed events from document: " + str(found_document_incarnation))
    sys.stdout.flush()
    return found_document_incarnation


if __name__ == "__main__":
    incarnation = "-1"
    while True:
        incarnation = advanced_sample(incarnation)
        json.dumps(incarnation)
