export * from "./class";
export * from "./duration";
export * from "./flags";
export * from "./serial";
export * from "./ref";
export * from "./events";
export * from "./absent";
export * from "./url";
