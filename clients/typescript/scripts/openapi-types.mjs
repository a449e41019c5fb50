// The TypeScript types of the REST contract, generated from docs/openapi.yaml with
// openapi-typescript. One function, used by `npm run generate` (writes src/generated/openapi.ts)
// and by the offline suite's drift test, which fails when the committed file is not what the
// contract generates today.
import { readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import openapiTS, { astToString } from "openapi-typescript";

export const CONTRACT = fileURLToPath(new URL("../../../docs/openapi.yaml", import.meta.url));
export const GENERATED = fileURLToPath(new URL("../src/generated/openapi.ts", import.meta.url));

const HEADER = `/**
 * The REST contract's types, generated from docs/openapi.yaml by openapi-typescript
 * (clients/typescript/scripts/openapi-types.mjs). Do not edit: run \`npm run generate\`.
 */

`;

/** The generated module's text. A `$ref` to a schema the contract does not define makes
 * openapi-typescript refuse the whole file; the server's suite checks that none is left
 * (tests/api/test_openapi_file.py). */
export async function generateTypes() {
  const ast = await openapiTS(await readFile(CONTRACT, "utf8"), { silent: true, emptyObjectsUnknown: true });
  return HEADER + astToString(ast);
}
