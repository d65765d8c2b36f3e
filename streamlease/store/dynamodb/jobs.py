"""``JobStore`` on DynamoDB: jobs (``Pk = JOB``) and run records (``Pk = RUN#<job>``, one
item per slot) in the fleet table."""

from __future__ import annotations

from typing import Any

from streamlease.core.fenced import PutItem
from streamlease.core.jobs import Job, JobList, JobRun, UnreadableJob
from streamlease.store import fleetcodec
from streamlease.store.codec import s
from streamlease.store.dynamodb.client import ConditionFailed, DynamoClient, DynamoTable

CLAIM_CONDITION = "attribute_not_exists(#pk)"


class DynamoJobStore(DynamoTable):
    def __init__(self, client: DynamoClient, table: str) -> None:
        super().__init__(client)
        self.table = table

    async def put_job(self, job: Job) -> bool:
        resp = await self._call("put_item", TableName=self.table,
                                Item=fleetcodec.encode_job(job), ReturnValues="ALL_OLD")
        return "Attributes" not in resp

    async def get_job(self, name: str) -> Job | UnreadableJob | None:
        resp = await self._call("get_item", TableName=self.table,
                                Key=fleetcodec.job_key(name), ConsistentRead=True)
        item = resp.get("Item")
        return fleetcodec.decode_job(item) if item else None

    async def list_jobs(self, timeout: float | None = None) -> JobList:
        decoded = [fleetcodec.decode_job(item)
                   for item in await self._query(s(fleetcodec.JOB_PK), timeout)]
        return JobList([j for j in decoded if isinstance(j, Job)],
                       [j for j in decoded if isinstance(j, UnreadableJob)])

    async def remove_job(self, name: str) -> bool:
        try:
            await self._call("delete_item", TableName=self.table, Key=fleetcodec.job_key(name),
                             ConditionExpression="attribute_exists(#pk)",
                             ExpressionAttributeNames={"#pk": fleetcodec.PK})
        except ConditionFailed:
            return False
        return True

    def claim_write(self, run: JobRun) -> PutItem:
        return PutItem(self.table, fleetcodec.encode_run(run), CLAIM_CONDITION,
                       {"#pk": fleetcodec.PK})

    async def claim_run(self, run: JobRun, timeout: float | None = None) -> bool:
        try:
            await self._call("put_item", timeout, TableName=self.table,
                             Item=fleetcodec.encode_run(run),
                             ConditionExpression=CLAIM_CONDITION,
                             ExpressionAttributeNames={"#pk": fleetcodec.PK})
        except ConditionFailed:
            return False
        return True

    async def finish_run(self, run: JobRun, timeout: float | None = None) -> bool:
        expr = fleetcodec.finish_expr(run)
        try:
            await self._call("update_item", timeout, TableName=self.table,
                             Key=fleetcodec.run_key(run.job, run.slot), **expr.update_kwargs())
        except ConditionFailed:
            return False
        return True

    async def abandon_run(self, job: str, slot: str, fence: int, now_wall_ms: int,
                          timeout: float | None = None) -> bool:
        expr = fleetcodec.abandon_expr(fence, now_wall_ms)
        try:
            await self._call("update_item", timeout, TableName=self.table,
                             Key=fleetcodec.run_key(job, slot), **expr.update_kwargs())
        except ConditionFailed:
            return False
        return True

    async def runs(self, job: str, last: int, timeout: float | None = None) -> list[JobRun]:
        items = await self._query(s(fleetcodec.RUN_PREFIX + job), timeout, newest_first=True,
                                  limit=last)
        return [run for run in map(fleetcodec.decode_run, items) if run is not None]

    async def _query(self, pk: dict[str, str], timeout: float | None,
                     newest_first: bool = False, limit: int | None = None) -> list[Any]:
        found: list[Any] = []
        kwargs: dict[str, Any] = {
            "TableName": self.table, "ConsistentRead": True,
            "KeyConditionExpression": "#pk = :pk", "ScanIndexForward": not newest_first,
            "ExpressionAttributeNames": {"#pk": fleetcodec.PK},
            "ExpressionAttributeValues": {":pk": pk},
        }
        while limit is None or len(found) < limit:
            if limit is not None:
                kwargs["Limit"] = limit - len(found)
            resp = await self._call("query", timeout, **kwargs)
            found.extend(resp.get("Items", []))
            if "LastEvaluatedKey" not in resp:
                break
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        return found
