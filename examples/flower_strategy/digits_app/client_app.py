"""The ClientApp: unchanged from a FedAvg project, except for ``mods=[dp_mod]``, which adds
this node's DP noise when the server asks for local or distributed DP."""

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from digits_app.task import evaluate, load_partition, make_model, train
from fedsafe.flower import dp_mod

app = ClientApp(mods=[dp_mod])


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    model = make_model()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = load_partition(context.node_config["partition-id"], context.node_config["num-partitions"])
    loss = train(model, x, y, int(context.run_config["local-epochs"]), float(context.run_config["lr"]))
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(y)})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate_fn(msg: Message, context: Context) -> Message:
    model = make_model()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = load_partition(context.node_config["partition-id"], context.node_config["num-partitions"])
    loss, acc = evaluate(model, x, y)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": acc, "num-examples": len(y)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
