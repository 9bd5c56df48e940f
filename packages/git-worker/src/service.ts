import { gitWorker, required, unary } from "@git-csi/protos";
import type { Logger } from "@git-csi/logging";
import { KeyedSerial } from "@git-csi/config";
import { prepareTree } from "./stage";
import type { Store } from "./store";

export function gitWorkerService(store: Store, logger: Logger): gitWorker.GitWorkerServer {
  // Git operations on one bare repository run one at a time: fetches and
  // worktree changes of two volumes of one URL would race for its locks.
  const perRepository = new KeyedSerial();
  return {
    probe: unary("probe", logger, async () => ({ ready: true, message: "" })),
    prepareTree: unary("prepare_tree", logger, async (request: gitWorker.PrepareTreeRequest) => {
      const volumeId = required(request.volumeId, "volume_id");
      const source = required(request.source, "source");
      required(source.url, "source.url");
      const tree = await perRepository.run(store.repoDir(source.url), () => prepareTree(store, volumeId, source));
      logger.info(tree.reused ? "reused the work tree the node kept" : "cloned the work tree", { volume: volumeId, operation: "prepare_tree", head: tree.head });
      return tree;
    }),
  };
}
