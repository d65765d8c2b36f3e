"""The only place that knows DynamoDB: codec (pure), schema, and the aioboto3 store."""
