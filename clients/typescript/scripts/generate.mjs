// npm run generate: writes src/generated/openapi.ts from docs/openapi.yaml.
import { writeFile } from "node:fs/promises";
import { GENERATED, generateTypes } from "./openapi-types.mjs";

await writeFile(GENERATED, await generateTypes());
console.log(`wrote ${GENERATED}`);
