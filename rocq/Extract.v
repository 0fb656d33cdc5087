(** Extraction of the table checker to JSON (MiniML), translated to Python by gen/jsonpy.py.
    Only the vector primitives of Vec.v and nat arithmetic are mapped; the generator knows
    each custom name below and refuses any other. *)
From Coq Require Import Extraction List Arith Bool.
From Govern Require Import Vec ZVec TableCheck Rules Compose.

Extraction Language JSON.

Extract Constant Vec.vlen => "prim_vlen".
Extract Constant Vec.mlen => "prim_mlen".
Extract Constant Vec.viota => "prim_viota".
Extract Constant Vec.vgather => "prim_vgather".
Extract Constant Vec.mgather => "prim_mgather".
Extract Constant Vec.vselect => "prim_vselect".
Extract Constant Vec.vadd => "prim_vadd".
Extract Constant Vec.veq => "prim_veq".
Extract Constant Vec.vequals => "prim_vequals".
Extract Constant Vec.vnotbit => "prim_vnotbit".
Extract Constant Vec.vmax => "prim_vmax".
Extract Constant Vec.vnth => "prim_vnth".
Extract Constant Vec.mnth => "prim_mnth".
Extract Constant Vec.mall => "prim_mall".
Extract Constant Vec.mor => "prim_mor".
Extract Constant Vec.mcount => "prim_mcount".
Extract Constant Vec.mwhere => "prim_mwhere".
Extract Constant Vec.mmark => "prim_mmark".
Extract Constant Vec.mfirst_false => "prim_mfirst_false".
Extract Constant Vec.vrank => "prim_vrank".
Extract Constant Vec.vgeq => "prim_vgeq".
Extract Constant Vec.mallat => "prim_mallat".
Extract Constant Vec.vjump => "prim_vjump".
Extract Constant Vec.vstepok => "prim_vstepok".

Extract Constant ZVec.zlen => "prim_zlen".
Extract Constant ZVec.zconst => "prim_zconst".
Extract Constant ZVec.zcol => "prim_zcol".
Extract Constant ZVec.zadd => "prim_zadd".
Extract Constant ZVec.zsub => "prim_zsub".
Extract Constant ZVec.zmin => "prim_zmin".
Extract Constant ZVec.zmax => "prim_zmax".
Extract Constant ZVec.zeq => "prim_zeq".
Extract Constant ZVec.zlt => "prim_zlt".
Extract Constant ZVec.zle => "prim_zle".
Extract Constant ZVec.zand => "prim_zand".
Extract Constant ZVec.zor => "prim_zor".
Extract Constant ZVec.znot => "prim_znot".
Extract Constant ZVec.zmulc => "prim_zmulc".
Extract Constant ZVec.zite => "prim_zite".
Extract Constant ZVec.znz => "prim_znz".
Extract Constant ZVec.zinrange => "prim_zinrange".
Extract Constant ZVec.ztonat => "prim_ztonat".
Extract Constant ZVec.mand => "prim_mand".
Extract Constant ZVec.mandn => "prim_mandn".
Extract Constant ZVec.zaxpy => "prim_zaxpy".
Extract Constant ZVec.zinand => "prim_zinand".
Extract Constant ZVec.mnone => "prim_mnone".
Extract Constant ZVec.vseleq => "prim_vseleq".
Extract Constant Coq.Init.Nat.mul => "prim_nat_mul".
Extract Constant PeanoNat.Nat.mul => "prim_nat_mul".
Extract Constant Coq.ZArith.BinInt.Z.add => "prim_z_add".
Extract Constant Coq.ZArith.BinInt.Z.of_nat => "prim_z_of_nat".
Extract Constant Coq.Init.Nat.eqb => "prim_nat_eqb".
Extract Constant Coq.Init.Nat.ltb => "prim_nat_ltb".
Extract Constant Coq.Init.Nat.leb => "prim_nat_leb".
Extract Constant Coq.Init.Nat.add => "prim_nat_add".
Extract Constant Coq.Init.Nat.log2 => "prim_nat_log2".
Extract Constant PeanoNat.Nat.eqb => "prim_nat_eqb".
Extract Constant PeanoNat.Nat.ltb => "prim_nat_ltb".
Extract Constant PeanoNat.Nat.leb => "prim_nat_leb".
Extract Constant PeanoNat.Nat.add => "prim_nat_add".
Extract Constant PeanoNat.Nat.log2 => "prim_nat_log2".
Extract Constant Coq.Init.Datatypes.andb => "prim_andb".

Extraction "_build/oracle.json" check_tables check_tables_w check_rules check_decomposition.
