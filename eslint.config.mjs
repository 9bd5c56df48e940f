// The linter, configured once for the whole tree. typescript-eslint's
// recommended rules without type information: they read each file alone, so
// a lint of the tree stays cheap on a small machine; tsc -b already checks
// the types. Formatting is Prettier's (.prettierrc.json), never a lint rule.
import js from "@eslint/js";
import tseslint from "typescript-eslint";

export default tseslint.config(
  { ignores: ["**/dist/**", "**/node_modules/**", "packages/protos/src/gen/**", ".cache/**", "bench/results/**", "tmp/**"] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    rules: {
      // tsc's noUnusedLocals and noUnusedParameters already refuse these.
      "@typescript-eslint/no-unused-vars": "off",
      // The packages compile to CommonJS: require() reads a package.json at run time and loads the FUSE addon.
      "@typescript-eslint/no-require-imports": "off",
    },
  },
);
