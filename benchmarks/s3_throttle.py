"""The S3 fault layer's figures, measured in one process against moto on loopback.

    python benchmarks/s3_throttle.py [--cap-mib 32] [--repeats 3]

(1) Accuracy of the bandwidth cap: a 64 MiB upload through the proxy capped at --cap-mib MiB/s;
the body's rate as the proxy paced it, and end to end as the client saw it (S3's own processing
included), each divided by the cap. (2) The time to write a multi-object checkpoint (three data
objects of the reference trainer's sizes at --hidden 1024, then the manifest) under each
throttle, divided by the unthrottled time: median of --repeats, interleaved.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import boto3
from botocore.config import Config

from spotchaos.storage import Bandwidth, FaultProxy, InternalError, Latency, MotoS3, SlowDown

CHECKPOINT = {"model.pt": 4_300_000, "optimizer.pt": 8_500_000, "trainer.pt": 15_000}  # bytes, as the trainer writes


def client(endpoint: str):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="AKIABENCHMARK",
        aws_secret_access_key="benchmark-secret",
        config=Config(retries={"mode": "standard", "total_max_attempts": 10}),
    )


def write_checkpoint(s3, prefix: str, payloads: dict[str, bytes]) -> float:
    started = time.perf_counter()
    for name, data in payloads.items():
        s3.put_object(Bucket="bench", Key=f"{prefix}/{name}", Body=data)
    s3.put_object(Bucket="bench", Key=f"{prefix}/manifest.json", Body=b'{"files": {}}')  # last: the commit
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap-mib", type=float, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cap = args.cap_mib * 2**20
    with MotoS3() as moto, FaultProxy(moto.endpoint) as proxy:
        s3 = client(proxy.endpoint)
        s3.create_bucket(Bucket="bench")
        body = os.urandom(64 * 2**20)
        proxy.add(Bandwidth(cap, downloads=False))
        started = time.perf_counter()
        s3.put_object(Bucket="bench", Key="big", Body=body)
        end_to_end = len(body) / (time.perf_counter() - started)
        sent, seconds = proxy.uploads[-1]
        print(f"bandwidth cap {args.cap_mib:g} MiB/s, 64 MiB upload:")
        print(f"  paced by the proxy: {sent / seconds / 2**20:.2f} MiB/s = {sent / seconds / cap:.3f} of the cap")
        print(f"  end to end (client): {end_to_end / 2**20:.2f} MiB/s = {end_to_end / cap:.3f} of the cap")
        proxy.clear()
        s3.delete_object(Bucket="bench", Key="big")

        payloads = {name: os.urandom(size) for name, size in CHECKPOINT.items()}
        throttles = {
            "none": [],
            "latency 50 ms": [Latency(0.05)],
            "bandwidth 16 MiB/s": [Bandwidth(16 * 2**20)],
            "SlowDown 20 %": [SlowDown(0.2, seed=1)],
            "InternalError 10 %": [InternalError(0.1, seed=2)],
        }
        times: dict[str, list[float]] = {name: [] for name in throttles}
        for repeat in range(args.repeats):
            for name, faults in throttles.items():
                proxy.clear()
                for fault in faults:
                    proxy.add(fault)
                times[name].append(write_checkpoint(s3, f"r{repeat}-{name.split()[0]}", payloads))
        proxy.clear()
    base = statistics.median(times["none"])
    size = sum(CHECKPOINT.values()) / 1e6
    print(f"checkpoint of {size:.1f} MB (3 objects + manifest) on S3, median of {args.repeats}:")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:20} {median * 1000:7.1f} ms   ratio {median / base:5.2f}")


if __name__ == "__main__":
    main()
