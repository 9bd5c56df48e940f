import { ProvisionError, renderTemplate } from "./provision";
import { isTagName } from "./ref";

/**
 * What a VolumeSnapshotClass's `tag` may name, and the external-snapshotter's
 * parameter (`--extra-create-metadata`) each takes its value from.
 */
export const TAG_VARIABLES: Record<string, string> = {
  "volumesnapshot.namespace": "csi.storage.k8s.io/volumesnapshot/namespace",
  "volumesnapshot.name": "csi.storage.k8s.io/volumesnapshot/name",
  "volumesnapshotcontent.name": "csi.storage.k8s.io/volumesnapshotcontent/name",
};

/**
 * The annotated tag a VolumeSnapshotClass asks each snapshot to be shown as
 * (`refs/tags/<rendered>`), or undefined when its `tag` is unset. Checked by
 * git's ref rules before anything is made.
 */
export function snapshotTagOf(parameters: Record<string, string>): string | undefined {
  const template = parameters.tag;
  if (template === undefined) return undefined;
  const tag = renderTemplate("tag", template, TAG_VARIABLES, parameters, "external-snapshotter");
  if (!isTagName(tag)) {
    const renders = tag === template ? "" : ` renders ${JSON.stringify(tag)}, which`;
    throw new ProvisionError(
      "tag",
      `${JSON.stringify(template)}${renders} is no tag name git accepts (refs/tags/<tag> by git check-ref-format's rules: no '..', '@{', spaces, control characters or any of ~^:?*[\\\\, no part starting with '.' or ending in '.lock')`,
    );
  }
  return `refs/tags/${tag}`;
}
