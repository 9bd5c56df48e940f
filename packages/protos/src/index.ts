export * as csi from "./gen/csi";
export * as gitcsi from "./gen/gitcsi/v1/volume";
export * as gitWorker from "./gen/gitcsi/v1/git_worker";
export * as mountOwner from "./gen/gitcsi/v1/mount_owner";
export * as pluginRegistration from "./gen/pluginregistration/registration";
export * from "./errors";
export * from "./transport";
export * from "./access-mode";
